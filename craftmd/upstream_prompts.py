"""Upstream CRAFT-MD's own prompts, read from its pinned code (``src/prompts.py``), never copied, imported or run.

The code files of the pinned commit are pinned apart (``dataset_builder/pin/<commit>.code.sha256``) and read through
:class:`craftmd.source.Source` from the code archive beside the data archive, or from upstream's own archive of the
commit (:func:`craftmd.source.code_location`). ``src/prompts.py`` is parsed with :mod:`ast` into one :class:`Template`
per function; a template renders exactly as calling upstream's function would. The parser reads only the constructs
the file uses (assignments and ``+=`` of string literals, f-strings naming a variable and ``+`` concatenation, an
``if name == "literal":`` with its ``else``, one final ``return``); anything else is refused in one line, so a changed
file is never rendered wrongly in silence. ``src/craftmd.py`` gives the doctor's opening line, the open-source
path's message cap and the multimodal path's image message (its role and content parts); ``src/utils.py`` the literals
of upstream's question split.
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from craftmd import CraftMDError
from craftmd.source import PINNED_COMMIT, Source, code_location, default_location

PROMPTS_PY = "src/prompts.py"
CRAFTMD_PY = "src/craftmd.py"
UTILS_PY = "src/utils.py"


def _unsupported(node: ast.AST, where: str, filename: str = PROMPTS_PY) -> CraftMDError:
    what = type(node).__name__
    return CraftMDError(
        f"upstream {filename}:{getattr(node, 'lineno', '?')}: {what} in {where} is not a construct the prompt parser "
        "reads (string literals, f-strings of a name, +, +=, if name == 'literal', return); the pinned code changed?"
    )


# --- parsing ---------------------------------------------------------------------------------
def _expr(node: ast.AST, where: str) -> list:
    """A string expression as parts: ["lit", text] | ["fmt", name] (an f-string field) | ["cat", name] (a name added
    with ``+``: must hold a str)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [["lit", node.value]]
    if isinstance(node, ast.Name):
        return [["cat", node.id]]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _expr(node.left, where) + _expr(node.right, where)
    if isinstance(node, ast.JoinedStr):
        parts = []
        for v in node.values:
            if isinstance(v, ast.Constant) and isinstance(v.value, str):
                parts.append(["lit", v.value])
            elif (
                isinstance(v, ast.FormattedValue)
                and isinstance(v.value, ast.Name)
                and v.conversion == -1
                and v.format_spec is None
            ):
                parts.append(["fmt", v.value.id])
            else:
                raise _unsupported(v, where)
        return parts
    raise _unsupported(node, where)


def _block(stmts: list[ast.stmt], where: str) -> list:
    out = []
    for s in stmts:
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name):
            out.append(["set", s.targets[0].id, _expr(s.value, where)])
        elif isinstance(s, ast.AugAssign) and isinstance(s.op, ast.Add) and isinstance(s.target, ast.Name):
            out.append(["add", s.target.id, _expr(s.value, where)])
        elif isinstance(s, ast.If):
            t = s.test
            if not (
                isinstance(t, ast.Compare)
                and isinstance(t.left, ast.Name)
                and len(t.ops) == 1
                and isinstance(t.ops[0], ast.Eq)
                and isinstance(t.comparators[0], ast.Constant)
                and isinstance(t.comparators[0].value, str)
            ):
                raise _unsupported(t, where)
            out.append(["if", t.left.id, t.comparators[0].value, _block(s.body, where), _block(s.orelse, where)])
        else:
            raise _unsupported(s, where)
    return out


@dataclass(frozen=True)
class Template:
    """One upstream prompt function: its name, parameters and body, as parsed."""

    name: str
    params: tuple[str, ...]
    body: tuple  # the statements, as nested lists (see _block); the returned expression last
    returns: tuple

    @property
    def text(self) -> str:
        """The template's canonical text (what its sha256 is taken over)."""
        return json.dumps([self.name, list(self.params), list(self.body), list(self.returns)], ensure_ascii=False)

    def render(self, *args) -> str:
        if len(args) != len(self.params):
            raise CraftMDError(
                f"upstream {self.name} takes {len(self.params)} arguments ({', '.join(self.params)}), {len(args)} given"
            )
        env = dict(zip(self.params, args))
        self._run(self.body, env)
        return self._eval(self.returns, env)

    def _run(self, stmts, env: dict) -> None:
        for s in stmts:
            if s[0] == "set":
                env[s[1]] = self._eval(s[2], env)
            elif s[0] == "add":
                env[s[1]] = self._value(s[1], env, "cat") + self._eval(s[2], env)
            else:  # if name == literal
                self._value(s[1], env, "fmt")  # set before it is read
                self._run(s[3] if env[s[1]] == s[2] else s[4], env)

    def _eval(self, parts, env: dict) -> str:
        out = []
        for kind, x in parts:
            out.append(x if kind == "lit" else self._value(x, env, kind))
        return "".join(out)

    def _value(self, name: str, env: dict, kind: str):
        if name not in env:
            raise CraftMDError(f"upstream {self.name}: {name} is read before it is set")
        v = env[name]
        if kind == "fmt":
            return v if isinstance(v, str) else format(v, "")
        if not isinstance(v, str):  # upstream's str + value would raise
            raise CraftMDError(f"upstream {self.name}: {name} must be a string, got {type(v).__name__}")
        return v


def parse_prompts(text: str, filename: str = PROMPTS_PY) -> dict[str, Template]:
    """Every function of upstream's ``prompts.py`` source ``text`` as a :class:`Template`; one line on anything else."""
    try:
        tree = ast.parse(text, filename=filename)
    except SyntaxError as exc:
        raise CraftMDError(f"upstream {filename}:{exc.lineno}: not Python ({exc.msg})") from None
    out: dict[str, Template] = {}
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            raise _unsupported(node, "the module", filename)
        a = node.args
        if node.decorator_list or node.returns or a.posonlyargs or a.vararg or a.kwonlyargs or a.kwarg or a.defaults:
            raise _unsupported(node, f"{node.name}'s signature", filename)
        if any(p.annotation for p in a.args):
            raise _unsupported(node, f"{node.name}'s signature", filename)
        body = node.body
        if not body or not isinstance(body[-1], ast.Return) or body[-1].value is None:
            raise _unsupported(body[-1] if body else node, f"{node.name} (it must end in one return)", filename)
        out[node.name] = Template(
            node.name,
            tuple(p.arg for p in a.args),
            tuple(_block(body[:-1], node.name)),
            tuple(_expr(body[-1].value, node.name)),
        )
    return out


# --- src/craftmd.py: the doctor's opening line and the open-source path's cap -------------------------
def _function(tree: ast.Module, name: str, filename: str = CRAFTMD_PY) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise CraftMDError(f"upstream {filename}: no function {name}")


def _opening(fn: ast.FunctionDef, variable: str, role: str) -> str:
    """The content of the ``role`` message in the list first assigned to ``variable`` inside ``fn``."""
    for node in ast.walk(fn):
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == variable
            and isinstance(node.value, ast.List)
        ):
            for d in node.value.elts:
                if not isinstance(d, ast.Dict):
                    continue
                kv = {k.value: v for k, v in zip(d.keys, d.values) if isinstance(k, ast.Constant)}
                r, c = kv.get("role"), kv.get("content")
                if isinstance(r, ast.Constant) and r.value == role and isinstance(c, ast.Constant) and isinstance(c.value, str):
                    return c.value
    raise CraftMDError(f"upstream {CRAFTMD_PY}: no literal {role} opening in {fn.name}'s {variable}")


def parse_utils(text: str) -> dict:
    """From upstream's ``utils.py``: the literals of ``get_case_without_question`` (its sentence regex, the words it
    drops from the question, the question of a case without one), which :func:`case_without_question` applies."""
    fn = _function(ast.parse(text, filename=UTILS_PY), "get_case_without_question", UTILS_PY)
    regex = [
        n.value.value
        for n in ast.walk(fn)
        if isinstance(n, ast.Assign) and [ast.unparse(t) for t in n.targets] == ["regex"] and isinstance(n.value, ast.Constant)
    ]
    dropped = [
        n.args[0].value
        for n in ast.walk(fn)
        if isinstance(n, ast.Call)
        and ast.unparse(n.func) == "last_sentence.replace"
        and len(n.args) == 2
        and isinstance(n.args[0], ast.Constant)
        and isinstance(n.args[1], ast.Constant)
        and n.args[1].value == ""
    ]
    default = [
        n.value.elts[1].value
        for n in ast.walk(fn)
        if isinstance(n, ast.Return)
        and isinstance(n.value, ast.Tuple)
        and len(n.value.elts) == 2
        and isinstance(n.value.elts[1], ast.Constant)
    ]
    if len(regex) != 1 or len(dropped) != 1 or len(default) != 1:
        raise CraftMDError(f"upstream {UTILS_PY}: get_case_without_question is not the split the package ports")
    return {"sentence": re.compile(regex[0]), "dropped": dropped[0], "no_question": default[0]}


def _image_messages(fn: ast.FunctionDef) -> list[tuple[str, tuple[str, ...]]]:
    """Every message literal inside ``fn`` whose content is a list of parts: (its role, the types of its parts in
    order), each part checked to be a text part (``text``) or an image part (``image_url`` holding ``url``)."""
    out = []
    for node in ast.walk(fn):
        if not isinstance(node, ast.Dict):
            continue
        kv = {k.value: v for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant)}
        role, content = kv.get("role"), kv.get("content")
        if not (isinstance(role, ast.Constant) and isinstance(content, ast.List)):
            continue
        types = []
        for part in content.elts:
            pv = (
                {k.value: v for k, v in zip(part.keys, part.values) if isinstance(k, ast.Constant)}
                if isinstance(part, ast.Dict)
                else {}
            )
            kind = pv.get("type")
            kind = kind.value if isinstance(kind, ast.Constant) else None
            inner = pv.get(kind) if kind else None
            if kind == "image_url" and isinstance(inner, ast.Dict) and [getattr(k, "value", None) for k in inner.keys] == ["url"]:
                types.append(kind)
            elif kind == "text" and inner is not None:
                types.append(kind)
            else:
                raise CraftMDError(
                    f"upstream {CRAFTMD_PY}:{part.lineno}: a content part of {fn.name} is not a text or image_url part"
                )
        out.append((role.value, tuple(types)))
    return out


def parse_craftmd(text: str) -> dict:
    """From upstream's ``craftmd.py``: the doctor's opening line (GPT path), the open-source path's cap on the
    doctor's message count (the conversation stops once ``len(history) >= cap``), and the multimodal path's image
    message (``craftmd_multimodal``): the role of the message that carries the image and its content parts in order,
    one layout for the doctor's prompt and both vignette questions."""
    tree = ast.parse(text, filename=CRAFTMD_PY)
    gpt = _function(tree, "craftmd_gpt")
    opening = _opening(gpt, "conversation_history_doctor", "assistant")
    if _opening(gpt, "conversation_history_patient", "user") != opening:
        raise CraftMDError(f"upstream {CRAFTMD_PY}: the doctor's and the patient's opening lines differ")
    mm = _function(tree, "craftmd_multimodal")
    if {_opening(mm, "conversation_history_doctor", "assistant"), _opening(mm, "conversation_history_patient", "user")} != {
        opening
    }:
        raise CraftMDError(f"upstream {CRAFTMD_PY}: craftmd_multimodal opens with another line than craftmd_gpt")
    layouts = _image_messages(mm)
    if len(layouts) < 3 or len(set(layouts)) != 1 or sorted(layouts[0][1]) != ["image_url", "text"]:
        raise CraftMDError(
            f"upstream {CRAFTMD_PY}: craftmd_multimodal has no single image message layout (one text part and one image "
            "part, for the doctor and both vignette questions)"
        )
    caps = [
        n.comparators[0].value
        for n in ast.walk(_function(tree, "craftmd_opensource"))
        if isinstance(n, ast.Compare)
        and isinstance(n.left, ast.Call)
        and isinstance(n.left.func, ast.Name)
        and n.left.func.id == "len"
        and [ast.unparse(x) for x in n.left.args] == ["conversation_history_doctor"]
        and len(n.ops) == 1
        and isinstance(n.ops[0], ast.GtE)
        and isinstance(n.comparators[0], ast.Constant)
        and type(n.comparators[0].value) is int
    ]
    if len(caps) != 1:
        raise CraftMDError(f"upstream {CRAFTMD_PY}: craftmd_opensource has no single len(history) >= N cap")
    return {"opening": opening, "opensource_message_cap": caps[0], "image_message": layouts[0]}


# --- reading the pinned code ---------------------------------------------------------------------------
@dataclass(frozen=True)
class UpstreamCode:
    """What the package reads from upstream's pinned code: the prompt templates and ``craftmd.py``'s facts."""

    location: str
    commit: str
    templates: dict[str, Template]
    opening: str
    opensource_message_cap: int
    image_message: tuple[str, tuple[str, ...]]  # craftmd_multimodal's image message: its role, its parts' types in order
    split: dict  # get_case_without_question's literals (parse_utils)

    def template(self, name: str) -> Template:
        try:
            return self.templates[name]
        except KeyError:
            raise CraftMDError(
                f"upstream {PROMPTS_PY} has no function {name!r}; it has: {', '.join(sorted(self.templates))}"
            ) from None


@lru_cache(maxsize=8)
def _load(location: str, commit: str) -> UpstreamCode:
    src = Source(location, commit, part="code")
    try:
        files = src.read_files([PROMPTS_PY, CRAFTMD_PY, UTILS_PY])
    except CraftMDError as exc:
        if "missing file" not in str(exc) and "no release folder of commit" not in str(exc):
            raise
        raise CraftMDError(
            f"upstream's code ({PROMPTS_PY} of commit {commit[:7]}) is not in {location}: put "
            f"craft-md-code-{commit}.tgz beside the data archive, or give upstream's own archive of the commit "
            "(--source / $CRAFTMD_SOURCE)"
        ) from None
    facts = parse_craftmd(files[CRAFTMD_PY].decode("utf-8"))
    split = parse_utils(files[UTILS_PY].decode("utf-8"))
    return UpstreamCode(location, commit, parse_prompts(files[PROMPTS_PY].decode("utf-8")), **facts, split=split)


def upstream_code(source: Source | str | os.PathLike | None = None) -> UpstreamCode:
    """The parsed upstream code (cached per location): ``source`` is the data source (a :class:`Source`, a path or URL;
    default :func:`craftmd.source.default_location`), or the code archive itself."""
    commit = source.commit if isinstance(source, Source) else PINNED_COMMIT
    loc = source.location if isinstance(source, Source) else source
    return _load(code_location(loc, commit), commit)


# --- upstream's inputs of a case (src/utils.py's get_case_without_question and get_choices, ported) -------------
CASES_CSV = "data/usmle_and_derm_dataset.csv"
CHOICES = ("choice_1", "choice_2", "choice_3", "choice_4")  # upstream's get_choices: the columns named choice, in order


def case_without_question(text: str, split: dict) -> tuple[str, str]:
    """Upstream's split of a CSV ``case_vignette`` (``split``: its literals, :func:`parse_utils`): the case without the
    first sentence with a "?" of its last line, and that sentence without the dropped words; a case with none keeps its
    text and gets upstream's default question."""
    last = text.split("\n")[-1] if "\n" in text else text
    question = next((q for q in split["sentence"].findall(last) if "?" in q), None)
    if question is None:
        return text, split["no_question"]
    return text.replace(question, ""), question.replace(split["dropped"], "")


@dataclass(frozen=True)
class UpstreamCase:
    """What upstream's code passes to its prompt functions for one case of its CSV."""

    specialty: str  # the CSV's category, as upstream passed it ("Other" gives no specialty)
    vignette: str  # case_desc: the case without its question, as upstream split it
    question: str
    choices: str  # ", ".join of the four choices, in the CSV's order
    options: tuple[str, ...] = ()  # the four choices, in the CSV's order (what -T answer_order=shuffled reorders)


@lru_cache(maxsize=4)
def _cases(location: str, commit: str) -> dict[str, UpstreamCase]:
    # Read with polars directly: the builder's parse_cases would import the dataset builder (seconds) for one CSV.
    import polars as pl

    split = _load(code_location(location, commit), commit).split
    data = Source(location, commit).read(CASES_CSV)
    try:
        df = pl.read_csv(io.BytesIO(data), infer_schema=False)
        rows = df.select("case_id", "case_vignette", "category", *CHOICES).iter_rows(named=True)
        return {
            r["case_id"]: UpstreamCase(
                r["category"],
                *case_without_question(r["case_vignette"], split),
                ", ".join(r[c] for c in CHOICES),
                tuple(r[c] for c in CHOICES),
            )
            for r in rows
        }
    except (pl.exceptions.PolarsError, UnicodeDecodeError, TypeError) as exc:
        raise CraftMDError(f"{CASES_CSV}: not the CSV upstream's code reads ({str(exc).splitlines()[0]})") from None


def upstream_cases(source: Source | str | os.PathLike | None = None) -> dict[str, UpstreamCase]:
    """case_id -> what upstream's code passes to its prompts for that case, from the pinned CSV (cached per location)."""
    if isinstance(source, Source):
        return _cases(source.location, source.commit)
    return _cases(str(source) if source is not None else default_location(), PINNED_COMMIT)


#: Upstream's GPT-4V results: the pinned data holds no NEJM case file with its vignettes (``data/nejm_imagechallenge_dataset.csv``
#: names the cases' URLs only; ``parallel_craftmd_multimodal.py`` reads an unreleased ``data/nejmai_dataset.csv``), so
#: what upstream's multimodal path passed its prompts for an NEJM case is what its results file recorded of the split.
IMAGE_RESULTS = "results/gpt4v/*.json"
#: The specialty an NEJM case is given: upstream's multimodal prompts name none, and its summarized questions call the
#: text path's functions with a ``specialty`` craftmd_multimodal never defines (a NameError in the pinned code): "Other"
#: is the value with which those functions name no specialty either.
IMAGE_SPECIALTY = "Other"


@lru_cache(maxsize=4)
def _image_cases(location: str, commit: str) -> dict[str, UpstreamCase]:
    out = {}
    for path, data in Source(location, commit).read_files([IMAGE_RESULTS]).items():
        try:
            d = json.loads(data)
            case_id, vignette, question = d["case_id"], d["case_vignette"], d["question"]
        except (ValueError, TypeError, KeyError) as exc:
            raise CraftMDError(f"{path}: not a results file of upstream's multimodal run ({type(exc).__name__})") from None
        if not all(isinstance(x, str) for x in (case_id, vignette, question)):
            raise CraftMDError(f"{path}: case_id, case_vignette and question must be text")
        out[case_id] = UpstreamCase(IMAGE_SPECIALTY, vignette, question, "")  # no choices are pinned for NEJM cases
    return out


def upstream_image_cases(source: Source | str | os.PathLike | None = None) -> dict[str, UpstreamCase]:
    """case_id -> what upstream's multimodal path passed its prompts for an NEJM Image Challenge case: the case and
    question as its GPT-4V results file recorded them (upstream's split of its unreleased CSV), the specialty
    :data:`IMAGE_SPECIALTY`, no choices (cached per location)."""
    if isinstance(source, Source):
        return _image_cases(source.location, source.commit)
    return _image_cases(str(source) if source is not None else default_location(), PINNED_COMMIT)


def upstream_prompt(name: str, *args, source=None) -> str:
    """Upstream's prompt function ``name`` rendered exactly as calling it with ``args`` would."""
    return upstream_code(source).template(name).render(*args)


def upstream_prompts_sha256(names: Iterable[str], source=None) -> str:
    """A sha256 identifying upstream's functions ``names`` (their parsed templates; order and repeats do not matter)."""
    code = upstream_code(source)
    h = hashlib.sha256()
    for name in sorted(set(names)):
        h.update(code.template(name).text.encode() + b"\0")
    return h.hexdigest()


__all__ = [
    "Template",
    "UpstreamCode",
    "parse_prompts",
    "parse_craftmd",
    "upstream_code",
    "upstream_cases",
    "upstream_image_cases",
    "case_without_question",
    "upstream_prompt",
    "upstream_prompts_sha256",
]
