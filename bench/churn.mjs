// Groups churn events ({ rank, ev }) the way an engine node sees them: windows of 64 events in
// arrival order, one batch per DP rank in each window.
export function batchesByRank(churn, window = 64) {
  const out = [];
  for (let i = 0; i < churn.length; i += window) {
    const byRank = new Map();
    for (const { rank, ev } of churn.slice(i, i + window)) {
      if (!byRank.has(rank)) byRank.set(rank, []);
      byRank.get(rank).push(ev);
    }
    for (const [dpRank, events] of byRank) out.push({ dpRank, events });
  }
  return out;
}
