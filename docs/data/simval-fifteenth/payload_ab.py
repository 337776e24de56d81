"""A/B of the payload rate, run on the code before it (feec3f5): every row's link rate x EFF, then compare.

    python docs/data/simval-fifteenth/payload_ab.py 1.0 RECORDS...        # the model before
    python docs/data/simval-fifteenth/payload_ab.py 0.956407 RECORDS...   # 1448/1514: an emulated port
"""

import sys

from geryon.sim.compare import compare, load_rows
from geryon.sim.scenario import SimSetting

EFF = float(sys.argv[1])
for path in sys.argv[2:]:
    rows = load_rows(path)
    for row in rows:
        for key in ("link_rate_bits", "bw_bits"):
            if row.get(key):
                row[key] = float(row[key]) * EFF
    results, _ = compare(rows, SimSetting())
    for r in results:
        print(f"{path.split('docs/data/')[-1][:45]:45} {str(r['link']):6} {r['policy']:16} w{r['workers']} "
              f"{r['measured_s']:.3f} sim {r['simulated_s']:.3f} {100 * r['error']:+6.1f}%")
