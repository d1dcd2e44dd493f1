"""Reading kept results back: the HTML/Markdown/CSV/JSON report of a run, comparing two runs,
retracting a result, and the index of a results tree.

This package reads result records only: it imports neither Ray nor vLLM (matplotlib is imported
inside the functions that draw). The CLI verbs ``report``, ``compare`` and ``retract`` call the
functions re-exported here.
"""

from __future__ import annotations

from omni_ray.report.comparison import Comparison, compare_runs, load_bands
from omni_ray.report.document import write_report
from omni_ray.report.index import write_index
from omni_ray.report.retraction import retract_result
from omni_ray.report.run import Run, load_run

__all__ = ["Comparison", "Run", "compare_runs", "load_bands", "load_run", "retract_result",
           "write_index", "write_report"]
