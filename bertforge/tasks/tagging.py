"""The tag family's module under its old name: `bertforge.tasks.tag` itself (the same module object), so that code
written against `bertforge.tasks.tagging` keeps working (module names follow the canonical family names)."""

import sys

from . import tag

sys.modules[__name__] = tag
