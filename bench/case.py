"""The plugin API's stable import path: ``bench.case`` is ``bench.model.case``."""

import sys

from bench.model import case as _module

sys.modules[__name__] = _module
