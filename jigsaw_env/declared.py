"""The classes a ``.pxd`` declares behave alike whether their module runs compiled or from source.

The optional compiled build (:mod:`jigsaw_env.accel`) turns each class that a ``.pxd`` beside its
module declares (``cdef class Name:``) into an extension type. Such a type differs from an
ordinary class in three ways a user can meet:

* its own attributes cannot be set or deleted: ``Simulator.step = f`` raises TypeError
  (``cannot set 'step' attribute of immutable type 'jigsaw_env.simulator.Simulator'``); a
  subclass can be patched, and an instance of a class with a ``__dict__`` takes new attributes;
* its declared attributes are C fields, not entries of the instance's ``__dict__``;
* a class declared without ``cdef dict __dict__`` takes no other attribute (AttributeError), and
  one without ``cdef object __weakref__`` no weak reference.

:func:`seal_declared_classes`, called at the end of each module with a ``.pxd``, gives the Python
source's classes the same three (its declared attributes become slots, and the class an instance
of :class:`DeclaredClass`), so code written against the sources runs unchanged on the compiled
build. On a compiled module it does nothing: the extension types are already so.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

#: the declarations of an augmenting ``.pxd`` this module reads: ``cdef class Name:``, then
#: indented ``cdef [public|readonly] [object|list|dict|tuple] a, b, ...`` attribute lines,
#: ``cdef dict __dict__`` and ``cdef object __weakref__`` (method signatures are skipped)
_CLASS = re.compile(r"cdef class (\w+)\s*:")
_ATTRS = re.compile(r"cdef\s+(?:(?:public|readonly)\s+)?(?:(?:object|list|dict|tuple)\s+)?(\w+(?:\s*,\s*\w+)*)$")


@dataclass(frozen=True)
class Declaration:
    """One ``cdef class`` of a ``.pxd``: its attributes (C fields, in order) and whether its
    instances have a ``__dict__`` and take weak references."""
    name: str
    attributes: tuple[str, ...]
    has_dict: bool
    weakref: bool


def read_declarations(pxd: Path) -> dict[str, Declaration]:
    """The classes ``pxd`` declares, by name. ValueError naming the file and line of an indented
    ``cdef`` line this reader does not understand."""
    found: dict[str, dict] = {}
    current = None
    for number, raw in enumerate(pxd.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].rstrip()
        if not line:
            continue
        if not line[0].isspace():
            m = _CLASS.fullmatch(line)
            current = found.setdefault(m.group(1), {"attributes": [], "has_dict": False, "weakref": False}) if m else None
            continue
        text = line.strip()
        if current is None or not text.startswith("cdef "):
            continue  # a decorator or a cpdef method's signature
        if text == "cdef dict __dict__":
            current["has_dict"] = True
        elif text == "cdef object __weakref__":
            current["weakref"] = True
        elif m := _ATTRS.fullmatch(text):
            current["attributes"] += [a.strip() for a in m.group(1).split(",")]
        else:
            raise ValueError(f"{pxd}:{number}: expected 'cdef [public] [object|list|dict|tuple] name, ...', "
                             f"got {text!r}")
    return {name: Declaration(name, tuple(d["attributes"]), d["has_dict"], d["weakref"]) for name, d in found.items()}


#: the classes :func:`sealed` made (not their subclasses)
_SEALED: set[type] = set()


class DeclaredClass(type):
    """The metaclass of a declared class in the sources: the class's own attributes cannot be set
    or deleted, with the TypeError an extension type raises. Its subclasses (instances of this
    metaclass too) can be patched, as a Python subclass of an extension type can."""

    def __setattr__(cls, name, value):
        cls._refuse_if_sealed(name)
        super().__setattr__(name, value)

    def __delattr__(cls, name):
        cls._refuse_if_sealed(name)
        super().__delattr__(name)

    def _refuse_if_sealed(cls, name: str) -> None:
        if cls in _SEALED:  # (CPython's message for an immutable type, set or delete alike)
            raise TypeError(f"cannot set {name!r} attribute of immutable type '{cls.__module__}.{cls.__qualname__}'")


def sealed(cls: type, declaration: Declaration) -> type:
    """``cls`` rebuilt as an instance of :class:`DeclaredClass` whose declared attributes are
    slots, with a ``__dict__`` and weak references only where ``declaration`` has them. A class
    attribute of a declared name (a dataclass field's default) is dropped, as ``dataclass(slots=
    True)`` drops it: the generated ``__init__`` holds the default."""
    names = set(declaration.attributes)
    namespace = {k: v for k, v in cls.__dict__.items() if k not in names and k not in ("__dict__", "__weakref__")}
    namespace["__qualname__"] = cls.__qualname__
    namespace["__slots__"] = declaration.attributes + (("__dict__",) if declaration.has_dict else ()) + (
        ("__weakref__",) if declaration.weakref else ())
    new = DeclaredClass(cls.__name__, cls.__bases__, namespace)
    _SEALED.add(new)
    return new


def seal_declared_classes(namespace: dict) -> None:
    """Replace, in a module's ``namespace`` (its ``globals()``), each class its ``.pxd`` declares
    by :func:`sealed` of it. Nothing happens on a compiled module (``__file__`` not a ``.py``).
    Call it last in the module, so that every use of the classes sees the sealed ones."""
    source = namespace.get("__file__") or ""
    if not source.endswith(".py"):
        return
    pxd = Path(source).with_suffix(".pxd")
    for name, declaration in read_declarations(pxd).items():
        cls = namespace.get(name)
        if not isinstance(cls, type):
            raise ValueError(f"{pxd}: declares class {name!r}, which {source} does not define")
        namespace[name] = sealed(cls, declaration)
