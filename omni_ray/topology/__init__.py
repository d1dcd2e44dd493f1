"""Where engines run: NUMA nodes read from sysfs (or psutil) and the slots cut from them.

Imports neither Ray nor vLLM.
"""

from omni_ray.topology.detection import allowed_cpus, cpu_features, detect
from omni_ray.topology.machine import ISA_FLAGS, NumaNode, Topology
from omni_ray.topology.slots import Slot, local_slots, make_slots, unused_cores
from omni_ray.topology.sysfs import format_cpulist, parse_cpulist

__all__ = [
    "ISA_FLAGS",
    "NumaNode",
    "Slot",
    "Topology",
    "allowed_cpus",
    "cpu_features",
    "detect",
    "format_cpulist",
    "local_slots",
    "make_slots",
    "parse_cpulist",
    "unused_cores",
]
