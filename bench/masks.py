"""The plugin API's stable import path: ``bench.masks`` is ``bench.model.masks``."""

import sys

from bench.model import masks as _module

sys.modules[__name__] = _module
