import sys, xml.etree.ElementTree as ET, collections
t = ET.parse(sys.argv[1]).getroot()
per_file = collections.Counter(); n = collections.Counter(); tests = []
for tc in t.iter("testcase"):
    f = tc.get("classname"); d = float(tc.get("time")); per_file[f] += d; n[f] += 1
    tests.append((d, f + "::" + tc.get("name")))
tot = sum(per_file.values())
print(f"total {tot:.0f} s, {len(tests)} tests")
for f, d in per_file.most_common(40): print(f"{d:8.1f} {n[f]:4d} {f}")
print()
for d, name in sorted(tests, reverse=True)[:70]: print(f"{d:8.1f} {name}")
