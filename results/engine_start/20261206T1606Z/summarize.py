"""Print the engine_start A/B: init_s, ready_s, RssAnon settled and peak during load per tree/arm."""
import json
import statistics
import sys
from pathlib import Path

here = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent)
rows = {}
for f in sorted(here.glob("*-r*.json")):
    tree, quant, _ = f.stem.rsplit("-", 2)
    rec = json.loads(f.read_text())
    m = rec["measurements"]
    rows.setdefault((tree, quant), []).append(
        (m["init_s"], m["ready_s"], m["rss_anon_tree_mb"], m["peak_rss_anon_during_load_mb"],
         rec["provenance"]["git"]["sha"][:7], rec["provenance"]["git"]["dirty"]))
print("| tree (git) | arm | init_s per round | ready_s median | RssAnon settled | peak during load |")
print("|---|---|---|---:|---|---|")
for (tree, quant), v in sorted(rows.items()):
    print(f"| {tree} ({v[0][4]}{', dirty' if v[0][5] else ''}) | {quant} | "
          f"{', '.join(f'{x[0]:.1f}' for x in v)} | {statistics.median(x[1] for x in v):.1f} | "
          f"{', '.join(f'{x[2]:.0f}' for x in v)} | {', '.join(f'{x[3]:.0f}' for x in v)} |")
