"""The multiple-choice family's module under its old name: `bertforge.tasks.multiple_choice` itself (the same module object), so that code
written against `bertforge.tasks.choice` keeps working (module names follow the canonical family names)."""

import sys

from . import multiple_choice

sys.modules[__name__] = multiple_choice
