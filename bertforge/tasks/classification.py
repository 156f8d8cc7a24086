"""The classify family's module under its old name: `bertforge.tasks.classify` itself (the same module object), so that code
written against `bertforge.tasks.classification` keeps working (module names follow the canonical family names)."""

import sys

from . import classify

sys.modules[__name__] = classify
