"""Field docstrings as field metadata, so that they reach Flyte's launch form.

Config dataclasses document each field with a string literal under it (the form Sphinx
and IDEs read). Python drops those strings at runtime; ``documented`` recovers them from
the class source and stores them as ``metadata["description"]``, which mashumaro puts
into the JSON schema that flytekit serializes with the task and workflow interfaces.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from types import MappingProxyType
from typing import TypeVar

T = TypeVar("T")


def field_docstrings(cls: type) -> dict[str, str]:
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    docs = {}
    for node, following in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(following.value.value)
    return docs


def documented(cls: type[T]) -> type[T]:
    """Class decorator (above ``@dataclass``): each field's docstring becomes its description."""
    docs = field_docstrings(cls)
    for name, f in cls.__dataclass_fields__.items():  # type: ignore[attr-defined]
        if name in docs:
            f.metadata = MappingProxyType({**f.metadata, "description": docs[name]})
    return cls
