"""The plugin API's stable import path: ``bench.registry`` is ``bench.model.registry``."""

import sys

from bench.model import registry as _module

sys.modules[__name__] = _module
