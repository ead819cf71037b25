//! Storage tiers of a router's index, from the events' `medium` (docs/architecture.md#router-side).

/// Where a worker holds a block: device (GPU) memory, host memory, or disk and external pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tier {
  Device = 0,
  Host = 1,
  Disk = 2,
}

impl Tier {
  pub const ALL: [Tier; 3] = [Tier::Device, Tier::Host, Tier::Disk];

  pub const fn name(self) -> &'static str {
    match self {
      Tier::Device => "device",
      Tier::Host => "host",
      Tier::Disk => "disk",
    }
  }

  /// The tier of a medium, with the exact (case-sensitive) names Dynamo's indexer accepts:
  /// absent or empty is the device; external pools count as disk. Any other medium has no tier
  /// (the event is counted and dropped, as Dynamo drops it).
  pub fn of_medium(medium: Option<&str>) -> Option<Tier> {
    match medium.unwrap_or("") {
      "" | "GPU" | "DEVICE" => Some(Tier::Device),
      "CPU" | "CPU_PINNED" | "CPU_TIER1" => Some(Tier::Host),
      "CPU_TIER2" | "DISK" | "NVME" | "STORAGE" | "EXTERNAL" | "NETWORK" | "REMOTE" | "SHARED" => {
        Some(Tier::Disk)
      }
      _ => None,
    }
  }
}
