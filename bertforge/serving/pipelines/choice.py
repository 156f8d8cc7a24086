"""The multiple-choice pipeline's module under its old name: `bertforge.serving.pipelines.multiple_choice` itself (the same module object), so that code
written against `bertforge.serving.pipelines.choice` keeps working (module names follow the canonical family names)."""

import sys

from . import multiple_choice

sys.modules[__name__] = multiple_choice
