"""Imported before torch by every benchmark that runs torch.profiler: the profiler's noise silenced at its source.

torch.profiler runs on Kineto, whose logger prints a line to stderr at every profile's start and stop
(`USDT:<time> <pid> SyncActivityProfilerHandler.cpp:52] profiler_start`, and `profiler_stop`), at its highest
severity but one. Its threshold is KINETO_LOG_LEVEL, read once, when torch loads: set after `import torch` it
changes nothing, hence this module. 6 is past every severity Kineto has (ERROR is 4, USDT 5), so its errors go too;
a profile that fails still fails where its events are read (common.kernel_us and count_launches count them).
KINETO_LOG_LEVEL set by the caller is kept.
"""

import os
import sys

if "torch" in sys.modules and "KINETO_LOG_LEVEL" not in os.environ:
    print("quiet_kineto: imported after torch, too late to quiet the profiler", file=sys.stderr)
os.environ.setdefault("KINETO_LOG_LEVEL", "6")
