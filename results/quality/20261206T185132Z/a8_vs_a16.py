"""W4A8 against W4A16 on the same weights: mean and max |logprob difference| of the quality
probe per pass, from this run's records (cpu_int4_a8 arm 28ed3cadc422, cpu_int4 arm
4343d9e24612), beside each one's distance from the bf16 arm (043eaa234092)."""
import json
import sys
from pathlib import Path

d = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent)


def lp(arm, p):
    return json.loads((d / f"{arm}.p{p}.json").read_text())["measurements"]["quality_logprobs"]


for p in (1, 2, 3):
    a8, a16, bf = lp("28ed3cadc422", p), lp("4343d9e24612", p), lp("043eaa234092", p)
    for name, x, y in (("a8 vs a16", a8, a16), ("a8 vs bf16", a8, bf), ("a16 vs bf16", a16, bf)):
        diff = [abs(u - v) for u, v in zip(x, y)]
        print(f"pass {p} {name}: mean {sum(diff) / len(diff):.4f} max {max(diff):.4f}")
