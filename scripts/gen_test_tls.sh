#!/usr/bin/env bash
# Generates the self-signed certificate the gRPC TLS test serves (fixtures/tls/): an EC P-256
# key and a certificate for localhost / 127.0.0.1, valid for 100 years. Test material only.
set -euo pipefail
dir="$(cd "$(dirname "$0")/.." && pwd)/fixtures/tls"
mkdir -p "$dir"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 36500 \
  -subj "/CN=localhost" -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
  -keyout "$dir/key.pem" -out "$dir/cert.pem"
