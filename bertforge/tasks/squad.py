"""The answer family's module under its old name: `bertforge.tasks.answer` itself (the same module object), so that code
written against `bertforge.tasks.squad` keeps working (module names follow the canonical family names)."""

import sys

from . import answer

sys.modules[__name__] = answer
