"""Write docs/api.md, the reference of evenflow's public Python API, from the package faces' docstrings.

    python docs/make_api_md.py            # rewrite docs/api.md
    python docs/make_api_md.py --check    # exit 1 when docs/api.md differs from what the faces give now

The public API is what the package faces export (their ``__all__``); every other module is internal.
For each face the page holds its docstring, then each exported name with its signature and the
first paragraph of its docstring. Importing the faces imports neither TensorFlow nor PyTorch, so
neither is needed here. Run it after changing an exported name, a signature or a docstring's first
paragraph; the test suite fails while docs/api.md is stale.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "api.md"
# The faces, in the order of the page: the top level first, then the layers, then the adapters.
FACES = ("evenflow", "evenflow.data", "evenflow.plan", "evenflow.records", "evenflow.run", "evenflow.report",
         "evenflow.tf", "evenflow.tf.ps", "evenflow.torch", "evenflow.ray")
WIDE = 100  # a signature longer than this is written one parameter a line

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj):`(~?)([^`<]+?)(?:\s*<[^>]*>)?`")


def _markdown(text: str) -> str:
    """reStructuredText roles and double backquotes as Markdown code."""
    text = _ROLE.sub(lambda m: f"`{m[2].rsplit('.', 1)[-1] if m[1] else m[2]}`", text)
    return text.replace("``", "`")


def _first_paragraph(doc: str | None) -> str:
    if not doc:
        return ""
    return " ".join(inspect.cleandoc(doc).split("\n\n", 1)[0].split())


class _Annotation:
    """A string annotation (``from __future__ import annotations``) shown without quotes."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _default(value):
    """A default as written in the signature: a function by its name (its repr holds a memory address)."""
    if value is inspect.Parameter.empty:
        return value
    if inspect.isfunction(value) or inspect.isclass(value) or inspect.isbuiltin(value):
        return _Annotation(value.__qualname__)
    return value


def _public(sig: inspect.Signature, kind: str) -> inspect.Signature:
    """The signature without its private parameters (``_name``), string annotations unquoted; a class's has no
    return annotation (its ``__init__`` returns None)."""
    params = [p.replace(annotation=_Annotation(p.annotation) if isinstance(p.annotation, str) else p.annotation,
                        default=_default(p.default))
              for p in sig.parameters.values() if not p.name.startswith("_")]
    ret = sig.return_annotation
    if kind == "class":
        ret = inspect.Signature.empty
    return sig.replace(parameters=params, return_annotation=_Annotation(ret) if isinstance(ret, str) else ret)


def _signature(kind: str, name: str, obj) -> str:
    """``def name(...) -> T`` or ``class Name(...)``; one parameter a line when it is wide."""
    try:
        sig = _public(inspect.signature(obj), kind)
    except (TypeError, ValueError):
        sig = None
    if kind == "class" and (sig is None or str(sig) == "(*args, **kwargs)"):
        bases = ", ".join(b.__name__ for b in obj.__bases__ if b is not object)
        return f"class {name}({bases})" if bases else f"class {name}"
    head = f"{kind} {name}"
    text = f"{head}{sig}"
    if len(text) <= WIDE:
        return text
    params = [str(p) for p in sig.parameters.values()]
    # The markers of positional-only and keyword-only parameters, as inspect writes them.
    shown, star = [], False
    for p, s in zip(sig.parameters.values(), params):
        if p.kind is p.KEYWORD_ONLY and not star:
            shown.append("*")
        star = star or p.kind in (p.VAR_POSITIONAL, p.KEYWORD_ONLY)
        shown.append(s)
        if p.kind is p.POSITIONAL_ONLY and (len(shown) == len(params) or
                                            list(sig.parameters.values())[len(shown)].kind is not p.POSITIONAL_ONLY):
            shown.append("/")
    ret = "" if sig.return_annotation is inspect.Signature.empty else \
        f" -> {inspect.formatannotation(sig.return_annotation)}"
    return head + "(\n" + "".join(f"    {s},\n" for s in shown) + ")" + ret


def _value(obj) -> str:
    """A constant as the page shows it: its repr, or a mapping's keys when its values are functions."""
    if isinstance(obj, dict) and any(callable(v) for v in obj.values()):
        return "{" + ", ".join(f"{k!r}: ..." for k in obj) + "}"
    return repr(obj)


def _comment(module: str, name: str, depth: int = 0) -> str:
    """The comment on or above the assignment of constant ``name``, following imports to where it is assigned."""
    path = Path(importlib.import_module(module).__file__)
    lines = path.read_text().splitlines()
    for node in ast.parse("\n".join(lines)).body:
        if isinstance(node, ast.ImportFrom) and depth < 5 and any((a.asname or a.name) == name for a in node.names):
            return _comment(node.module, next(a.name for a in node.names if (a.asname or a.name) == name), depth + 1)
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            same_line = lines[node.lineno - 1].partition("  # ")[2]
            above, i = [], node.lineno - 2
            while i >= 0 and lines[i].lstrip().startswith("#"):
                above.insert(0, lines[i].strip().lstrip("#").strip())
                i -= 1
            return " ".join(above) or same_line.strip()
    return ""


def _entry(face: str, name: str, obj, first_seen: dict) -> list[str]:
    full = f"{face}.{name}"
    lines = [f'<a id="{full}"></a>', "", f"### `{full}`", ""]
    home = first_seen.get(id(obj))
    if home is not None and home[1] is obj:
        return lines + [f"The same as [`{home[0]}`](#{home[0]}).", ""]
    if not isinstance(obj, (bool, int, float, str)):  # small literals are shared objects, not one export
        first_seen.setdefault(id(obj), (full, obj))
    if inspect.isclass(obj) or callable(obj):
        kind = "class" if inspect.isclass(obj) else "def"
        # Classes: their own docstring, never one inherited from a base (inspect.getdoc would).
        doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
        lines += ["```text", _signature(kind, name, obj), "```", ""]
    else:
        doc = _comment(face, name)
        lines += ["```text", f"{name} = {_value(obj)}", "```", ""]
    about = _markdown(_first_paragraph(doc))
    return lines + ([about, ""] if about else [])


def render() -> str:
    """The text of docs/api.md for the faces of this checkout."""
    lines = ["# Python API reference", "",
             "The public API of evenflow is what its package faces export: the names below, generated from "
             "their docstrings by `python docs/make_api_md.py` (the test suite fails when this page is stale). "
             "Every other module is internal and may change without notice. Importing a face imports no "
             "framework; TensorFlow and PyTorch are imported when first used.", ""]
    lines += [f"- [`{face}`](#{face}): {len(importlib.import_module(face).__all__)} names" for face in FACES]
    first_seen: dict = {}
    for face in FACES:
        module = importlib.import_module(face)
        lines += ["", f'<a id="{face}"></a>', "", f"## `{face}`", "", _markdown(inspect.cleandoc(module.__doc__)), ""]
        for name in sorted(module.__all__, key=lambda n: (n.lower(), n)):
            lines += _entry(face, name, getattr(module, name), first_seen)
    text = "\n".join(lines).rstrip("\n") + "\n"
    if re.search(r" at 0x[0-9a-f]+", text):  # a memory address would change from run to run
        raise ValueError(f"{OUT.name} would hold a memory address: {re.search(r'.{0,80} at 0x[0-9a-f]+', text)[0]}")
    return text


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from generated_page import write_or_check

    return write_or_check(OUT, render, "the docstrings of evenflow's package faces", argv)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    sys.exit(main())
