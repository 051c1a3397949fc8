"""The plugin API's stable import path: ``bench.probe`` is ``bench.measure.probe``."""

import sys

from bench.measure import probe as _module

sys.modules[__name__] = _module
