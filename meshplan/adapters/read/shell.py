"""Reads a shell launch script without running it: the words of each command, variables expanded from the script.

Nothing is executed. Assignments (`TP=4`, `export X=...`, `ARGS=( ... )`, `ARGS+=( ... )`) are recorded with their
line; `$X`, `${X}`, `${X:-4}` (the default used when the script never sets X), `${X[@]}` and `$((a*b))` expand from
them; `if [ ... ]` / `[[ ... ]]` conditions of string and integer comparisons are evaluated, any other condition
(a file test, a command's status) leaves both branches unread and says so. `eval WORDS` reads its words again as
a line of the script, as the shell runs them (a launch command held in a variable: `eval "$COMMAND"`).
Heredocs written to a file (`cat <<EOT > $DS_CONFIG`) are kept as that file's text. `read -r A B <<< "$X"` splits X
at IFS into the names. A `for NAME in WORDS` loop over words the script states has its body read once, with the first
word, and is said with every value (Script.loops: a script looping over layouts launches each). Command
substitutions (`$(...)`), other loops and functions are never run; what they would have set is reported as
unresolved.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field, replace

from meshplan.core.errors import MeshplanError


@dataclass(frozen=True)
class Word:
    """One word of a command after expansion: its text, the script line it came from, and the variable (if any)
    whose value it is, with that variable's line."""

    text: str
    line: int
    var: str | None = None
    var_line: int | None = None


@dataclass
class Var:
    value: str
    line: int
    items: list[Word] | None = None  # an array's elements


@dataclass
class Command:
    words: list[Word]
    line: int
    runner: list[Word] = field(default_factory=list)  # what runs a `bash -c` string's command (srun ... bash -c)
    call: str | None = None  # the shell function whose first call ran it, with every call (Reader.call)


@dataclass
class Script:
    path: str
    env: dict[str, Var] = field(default_factory=dict)
    commands: list[Command] = field(default_factory=list)
    files: dict[str, tuple[str, int]] = field(default_factory=dict)  # heredoc text written to a path, first line
    unresolved: list[str] = field(default_factory=list)
    loops: list[str] = field(default_factory=list)  # each `for` loop read once: its values, and the one read
    arguments: dict[str, str] = field(default_factory=dict)  # a variable set from the script's own argument: "$1"
    unread: list[tuple[int, str]] = field(default_factory=list)  # lines of blocks not read (a loop, an `if`)

    def note(self, line: int, text: str) -> None:
        entry = f"{self.path}:{line} {text}"
        if entry not in self.unresolved:
            self.unresolved.append(entry)


# --------------------------------------------------------------------------- logical lines


@dataclass
class _Line:
    text: str
    starts: list[tuple[int, int]]  # (offset in text, physical line number)
    heredoc: tuple[str, int] | None = None  # the body of a heredoc this line opens, and its first line

    def line_at(self, offset: int) -> int:
        line = self.starts[0][1]
        for start, number in self.starts:
            if start <= offset:
                line = number
        return line


HEREDOC = re.compile(r"<<(-?)\s*(['\"]?)(\w+)\2")


def _balanced(text: str) -> bool:
    """Whether `text` closes every quote and array parenthesis it opens (comments ignored)."""
    quote, depth, i = None, 0, 0
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\" and quote == '"':
                i += 1
            elif c == quote:
                quote = None
        elif c == "\\":
            i += 1
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or text[i - 1] in " \t\n;("):
            nl = text.find("\n", i)
            if nl < 0:
                break
            i = nl
        elif c == "(" and i and text[i - 1] == "=":
            depth += 1
        elif c == ")" and depth:
            depth -= 1
        i += 1
    return quote is None and depth == 0


def logical_lines(text: str) -> list[_Line]:
    """Physical lines joined where a backslash continues them, a quote or an array stays open; heredoc bodies
    attached to the line that opens them."""
    physical = text.split("\n")
    out: list[_Line] = []
    i = 0
    while i < len(physical):
        cur = _Line("", [])
        while True:
            piece = physical[i]
            cur.starts.append((len(cur.text), i + 1))
            i += 1
            # a comment line ends at its newline: its trailing backslash continues nothing (bash)
            comment = not cur.text.strip() and piece.lstrip().startswith("#")
            if piece.endswith("\\") and not piece.endswith("\\\\") and not comment:
                cur.text += piece[:-1] + " "
                if i < len(physical):
                    continue
                break
            cur.text += piece
            if _balanced(cur.text) or i >= len(physical):
                break
            cur.text += "\n"
        m = HEREDOC.search(cur.text)
        if m and not cur.text.lstrip().startswith("#"):
            body, first = [], i + 1
            while i < len(physical) and (physical[i].strip() if m.group(1) else physical[i]) != m.group(3):
                body.append(physical[i])
                i += 1
            i += 1
            cur.heredoc = ("\n".join(body) + "\n", first)
            cur.text = cur.text[: m.start()] + ("<<'" if m.group(2) else "<<") + cur.text[m.end():]
        out.append(cur)
    return out


# --------------------------------------------------------------------------- words


@dataclass
class _Raw:
    """A word before expansion: segments of (text, quoting) where quoting is "'", '"' or ''."""

    parts: list[tuple[str, str]]
    offset: int


def split_words(text: str) -> list[_Raw | str]:
    """The words of a logical line, with the operators ; && || | as separate strings; a comment ends the line."""
    out: list[_Raw | str] = []
    parts: list[tuple[str, str]] = []
    buf, start, i = "", None, 0

    def flush() -> None:
        nonlocal parts, buf, start
        if buf:
            parts.append((buf, ""))
        if parts:
            out.append(_Raw(parts, start or 0))
        parts, buf, start = [], "", None

    while i < len(text):
        c = text[i]
        if c in " \t\n":
            flush()
        elif c == "#" and start is None:
            nl = text.find("\n", i)
            if nl < 0:
                break
            i = nl
            continue
        elif c in "'\"":
            start = i if start is None else start
            end = i + 1
            while end < len(text) and text[end] != c:
                end += 2 if (text[end] == "\\" and c == '"') else 1
            if buf:
                parts.append((buf, ""))
                buf = ""
            parts.append((text[i + 1:end].replace('\\"', '"') if c == '"' else text[i + 1:end], c))
            i = end
        elif c == "\\" and i + 1 < len(text):
            start = i if start is None else start
            buf += text[i + 1]
            i += 1
        elif c in ";|&" and not buf.endswith(("$", "=")):
            flush()
            op = text[i:i + 2] if text[i:i + 2] in ("&&", "||") else c
            out.append(op)
            i += len(op)
            continue
        elif c == "$" and text[i + 1:i + 2] in ("(", "{"):
            start = i if start is None else start
            close = {"(": ")", "{": "}"}[text[i + 1]]
            depth, end = 0, i + 1
            while end < len(text):
                depth += text[end] == text[i + 1]
                depth -= text[end] == close
                if depth == 0:
                    break
                end += 1
            buf += text[i:end + 1]
            i = end
        else:
            start = i if start is None else start
            buf += c
        i += 1
    flush()
    return out


# a default may hold one level of ${...} itself: ${X:-"${HOME}/verl"}
VAR_REF = re.compile(r"\$(?:\{(#?)([A-Za-z_][A-Za-z0-9_]*|[0-9@*#])(\[[@*0-9]+\])?"
                     r"(?:(:?[-=+?]|##?|%%?)((?:\$\{[^}]*\}|[^}])*))?\}"
                     r"|([A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$])|(\(\((.*)\)\))|(\((.*?)\)))", re.S)


MAX_CONFIG_CHARS = 1 << 20
"""A launch script is a few kilobytes: a longer text is refused, not read (read/__init__.py import_config), and so is a
script whose variables expand to more than this in all (a variable or array built from itself line after line doubles
at each: forty such lines would take hours and gigabytes to read)."""


class Expander:
    """Expands words against a script's variables, noting what cannot be resolved."""

    def __init__(self, script: Script):
        self.script = script
        self.expanded = 0  # characters the script's references have expanded to so far: at most MAX_CONFIG_CHARS

    def value(self, ref: re.Match[str], line: int) -> tuple[str, str | None, list[Word] | None]:
        """A reference's text, the variable it read (None for a literal default) and an array's words; refused once
        the script's references have expanded to more than MAX_CONFIG_CHARS in all."""
        text, name, items = self._value(ref, line)
        self.expanded += len(text) + len(items or ())
        if self.expanded > MAX_CONFIG_CHARS:
            raise MeshplanError(
                f"{self.script.path}:{line}: the script's variables expand to more than {MAX_CONFIG_CHARS:,} "
                f"characters{f' (here ${name})' if name else ''}; a launch script and what it expands to are at "
                f"most that (a variable or array built from itself again and again?).",
                fix="Pass the launch script as it is run, each variable set to the value the run uses.")
        return text, name, items

    def _value(self, ref: re.Match[str], line: int) -> tuple[str, str | None, list[Word] | None]:
        env = self.script.env
        if ref.group(7):  # $(( arithmetic )): bare names are variables
            expr = re.sub(r"[A-Za-z_]\w*", lambda m: env[m.group(0)].value if m.group(0) in env else m.group(0),
                          self.text(ref.group(8), line))
            if re.fullmatch(r"[0-9+\-*/ ()%]+", expr) and "**" not in expr and len(expr) < 200:
                try:  # digits and + - * / % only: nothing else reaches eval
                    return str(int(eval(expr.replace("/", "//"), {"__builtins__": {}}))), None, None
                except (SyntaxError, ZeroDivisionError, ValueError):
                    pass
            self.script.note(line, f"$(({ref.group(8)})) not evaluated")
            return "", None, None
        if ref.group(9):  # $( command ): never run
            self.script.note(line, f"$({ref.group(10)}) is a command's output: not run, left empty")
            return "", None, None
        name = ref.group(2) or ref.group(6)
        op, default = ref.group(4), ref.group(5)
        var = env.get(name)
        if var is not None and ref.group(3) and var.items is not None:
            return " ".join(w.text for w in var.items), name, var.items
        if var is not None and op in ("#", "##", "%", "%%"):  # the shortest / longest prefix or suffix removed
            return _trimmed(var.value, op, self.text(default or "", line)), name, None
        if var is not None and (var.value or op not in (":-", ":=")):
            return var.value, name, None
        if op in ("-", ":-", "=", ":="):
            default = default or ""
            if len(default) >= 2 and default[0] == default[-1] and default[0] in "'\"":
                default = default[1:-1]  # ${X:-"text"}: the quotes are the default's own quoting
            text = self.text(default, line)
            if op.endswith("="):
                env[name] = Var(text, line)
            return text, None, None
        if name in ("@", "*", "#", "?", "$", "IFS") or name.isdigit():  # IFS unset: the shell splits at blanks
            return "", None, None  # the script's own arguments: none when read
        self.script.note(line, f"${name} is not set in the script: left empty")
        return "", None, None

    def text(self, text: str, line: int) -> str:
        return VAR_REF.sub(lambda m: self.value(m, line)[0], text)

    def words(self, raw: _Raw, line: int) -> list[Word]:
        """A raw word expanded: unquoted expansions split on whitespace, a quoted array gives one word per item."""
        out: list[Word] = []
        current, via, via_line, current_line = "", None, None, None
        for text, quoting in raw.parts:
            if quoting == "'":
                current += text
                continue
            pos = 0
            for m in VAR_REF.finditer(text):
                if quoting == '"' and m.start() and text[m.start() - 1] == "\\":  # "\$X": a literal $X
                    current += text[pos:m.start() - 1] + m.group(0)
                    pos = m.end()
                    continue
                current += text[pos:m.start()]
                pos = m.end()
                value, name, items = self.value(m, line)
                if name is not None:
                    via, via_line = name, self.script.env[name].line if name in self.script.env else None
                if items is not None and quoting == '"' and m.group(0).endswith("[@]}"):
                    if current:
                        out.append(Word(current, line))
                    out.extend(items[:-1])
                    current = items[-1].text if items else ""
                    continue
                if quoting == "" and (value.strip() != value or " " in value or "\n" in value):
                    pieces = value.split()
                    if not pieces:
                        continue
                    lines = [w.line for w in items] if items and len(items) == len(pieces) else None
                    for k, piece in enumerate(pieces[:-1]):
                        out.append(Word(current + piece if k == 0 else piece,
                                        lines[k] if lines else via_line or line, via, via_line))
                        current = ""
                    current = ("" if len(pieces) > 1 else current) + pieces[-1]
                    current_line = lines[-1] if lines else via_line
                    continue
                current += value
            current += text[pos:]
        out.append(Word(current, current_line or line, via, via_line))
        quoted = any(q for _, q in raw.parts)
        return [w for w in out if w.text or quoted]


# --------------------------------------------------------------------------- statements

MAX_EVAL_DEPTH = 4  # `X='eval $X'; eval $X` would never end: evals nested deeper are not read
ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(\+?)=(.*)$", re.S)


def _trimmed(value: str, op: str, pattern: str) -> str:
    """`${X#pat}`, `${X##pat}`, `${X%pat}`, `${X%%pat}`: the shortest (one sign) or longest (two) prefix (#) or suffix
    (%) matching the glob pattern removed, as the shell's parameter expansion does."""
    cuts = range(len(value) + 1) if len(op) == 1 else range(len(value), -1, -1)
    for n in cuts:
        part = value[:n] if op[0] == "#" else value[len(value) - n:]
        if fnmatch.fnmatchcase(part, pattern):
            return value[n:] if op[0] == "#" else value[:len(value) - n]
    return value


def _condition(words: list[str]) -> bool | None:
    """A `[ ... ]`, `[[ ... ]]` or `test ...` condition of string or integer comparisons, joined by || and &&
    (left to right, as the shell does); None for anything else (a file test, a command's status)."""
    for op in ("||", "-o", "&&", "-a"):
        if op in words:
            k = len(words) - 1 - words[::-1].index(op)
            left, right = _condition(words[:k]), _condition(words[k + 1:])
            if op in ("||", "-o"):
                return True if True in (left, right) else None if None in (left, right) else False
            return False if False in (left, right) else None if None in (left, right) else True
    pattern = words[:1] == ["[["]  # [[ a == b ]]: b a glob pattern (unquoted in the script, as its words are here)
    while words and words[0] in ("[", "[[", "test"):
        words = words[1:-1] if words[0] != "test" else words[1:]
    negate = words[:1] == ["!"]
    words = words[1:] if negate else words
    result: bool | None = None
    if len(words) == 3 and words[1] in ("=", "==", "!="):
        same = fnmatch.fnmatchcase(words[0], words[2]) if pattern else words[0] == words[2]
        result = same == (words[1] != "!=")
    elif len(words) == 3 and words[1] in ("-eq", "-ne", "-gt", "-lt", "-ge", "-le"):
        try:
            a, b = int(words[0]), int(words[2])
        except ValueError:
            return None
        result = {"-eq": a == b, "-ne": a != b, "-gt": a > b, "-lt": a < b, "-ge": a >= b, "-le": a <= b}[words[1]]
    elif len(words) == 2 and words[0] in ("-z", "-n"):
        result = (words[1] == "") == (words[0] == "-z")
    elif len(words) == 1 and words[0] in ("true", "false"):
        result = words[0] == "true"
    return None if result is None else result != negate


class Reader:
    """Walks a script's statements, recording assignments, heredoc files and the commands that would run."""

    def __init__(self, text: str, path: str):
        self.script = Script(path)
        self.expand = Expander(self.script)
        self.branches: list[list[bool | None]] = []  # per open `if`: the value of each branch so far
        self.skip_depth = 0  # open loops, functions and case blocks: their bodies are not read
        self.eval_depth = 0  # evals being read inside one another
        self.loops: list[str] = []  # open `for` loops whose body is read once (their variables)
        self.functions: dict[str, list[_Line]] = {}  # shell functions defined so far: their bodies' lines
        self.capture: tuple[str, list[_Line]] | None = None  # a function definition being read: its name, body
        self.calls: dict[str, list[tuple[int, list[Word]]]] = {}  # each function's calls: line, arguments
        self.call_depth = 0
        self.first_calls: dict[str, tuple[int, int]] = {}  # the commands each function's first call added
        self.lines = logical_lines(text)
        self._slurm_nodes(text)

    def _slurm_nodes(self, text: str) -> None:
        """`#SBATCH --nodes=N` (or -N N): sbatch exports the node count as SLURM_NNODES / SLURM_JOB_NUM_NODES, which
        the script's launch line reads (a range N-M: its lower end, noted); `--ntasks-per-node` and `--gpus-per-node`
        as SLURM_NTASKS_PER_NODE and SLURM_GPUS_PER_NODE, as sbatch exports them."""
        for number, line in enumerate(text.split("\n"), start=1):
            for flag, name in (("ntasks-per-node", "SLURM_NTASKS_PER_NODE"), ("gpus-per-node", "SLURM_GPUS_PER_NODE")):
                per = re.match(rf"#SBATCH\b.*?--{flag}[= ]\s*(\d+)(?:\s|$)", line.strip())
                if per:
                    self.script.env.setdefault(name, Var(per.group(1), number))
            m = re.match(r"#SBATCH\b.*?(?:--nodes[= ]\s*|\s-N\s*)(\d+)(-\d+)?(?:\s|$)", line.strip())
            if m:
                for name in ("SLURM_NNODES", "SLURM_JOB_NUM_NODES"):
                    self.script.env.setdefault(name, Var(m.group(1), number))
                if m.group(2):
                    self.script.note(number, f"#SBATCH nodes {m.group(1)}{m.group(2)}: read as {m.group(1)}")

    def active(self) -> bool:
        return self.skip_depth == 0 and all(b[-1] is True for b in self.branches)

    def read(self) -> Script:
        for logical in self.lines:
            capturing = self.capture is not None
            if self.skip_depth or not self.active():
                self.script.unread.append((logical.starts[0][1], logical.text))
            self.read_line(logical)
            if capturing and self.capture is not None:
                if self.skip_depth == 0:
                    self.functions[self.capture[0]] = self.capture[1]
                    self.capture = None
                else:
                    self.capture[1].append(logical)
        self._said_calls()
        if self.branches:
            raise MeshplanError(f"{self.script.path}: an `if` is never closed by `fi`.",
                                fix="Check the script's if/fi pairs.")
        return self.script

    def read_line(self, logical: _Line) -> None:
        """The statements of one logical line, split at ; && || |."""
        items = split_words(logical.text)
        statement: list[_Raw] = []
        for item in [*items, ";"]:
            if item in ("&&", "||") and statement and "".join(
                    t for t, _ in statement[0].parts) in ("if", "elif", "while"):
                statement.append(_Raw([(item, "")], 0))  # one condition: `[[ a ]] || [[ b ]]`
                continue
            if isinstance(item, str):
                if statement:
                    self.statement(statement, logical)
                statement = []
            else:
                statement.append(item)

    def eval(self, words: list[Word], line: int) -> None:
        """`eval "$COMMAND"`: its words joined and read again as a line of the script, as eval runs them (a launch
        command held in a variable, quoted or not, with the quotes inside it); each word it gives keeps the line, and
        the variable, of the word it came from."""
        if self.eval_depth >= MAX_EVAL_DEPTH:
            self.script.note(line, f"eval nested over {MAX_EVAL_DEPTH} deep: not read")
            return
        starts, text = [], ""
        for w in words:
            starts.append((len(text), w.line))
            text += w.text + " "
        origin = {w.line: w for w in words if w.var is not None}  # a word's line -> the variable word it came from
        first = len(self.script.commands)
        self.eval_depth += 1
        try:
            self.read_line(_Line(text, starts))
        finally:
            self.eval_depth -= 1
        for command in self.script.commands[first:]:
            command.line = line
            command.words = [replace(w, var=origin[w.line].var, var_line=origin[w.line].var_line)
                             if w.var is None and w.line in origin else w for w in command.words]

    def statement(self, raws: list[_Raw], logical: _Line) -> None:
        line = logical.line_at(raws[0].offset)
        head = "".join(t for t, _ in raws[0].parts)
        second = "".join(t for t, _ in raws[1].parts) if len(raws) > 1 else ""
        if head == "for" and self.skip_depth == 0 and self.active() and self.read_loop(raws, line):
            return
        if head in ("for", "while", "until", "select", "case", "function") or re.fullmatch(r"[\w-]+\(\)", head) \
                or second == "()":
            reading = self.skip_depth == 0 and self.active()
            self.skip_depth += 1
            name = second.removesuffix("()") if head == "function" else head.removesuffix("()")
            function = head == "function" or head.endswith("()") or second == "()"
            if function and reading and self.capture is None and \
                    re.fullmatch(r"[\w-]+", name) and not any("".join(t for t, _ in r.parts) == "}" for r in raws):
                self.capture = (name, [])  # its body kept, read at its first call (Reader.call)
                return
            if self.skip_depth == 1:
                self.script.note(line, f"a `{head.rstrip('()')}` block is not run: what it sets or launches is not "
                                       "read")
            if head in ("for", "while", "until", "select") and any("".join(t for t, _ in r.parts) == "done"
                                                                   for r in raws[1:]):
                self.skip_depth -= 1
            return
        if head == "done" and self.skip_depth == 0 and self.loops:  # the end of a loop read once
            self.loops.pop()
            return
        if head in ("done", "esac", "}"):
            self.skip_depth = max(0, self.skip_depth - 1)
            return
        if self.skip_depth:
            return
        if head in ("if", "elif"):
            words = [w.text for r in raws[1:] for w in self.expand.words(r, line)]
            value = _condition(words) if self.active() or head == "elif" else False
            if head == "if":
                self.branches.append([value])
            elif self.branches:
                previous = self.branches[-1]
                value = False if any(b is True for b in previous) else value
                previous.append(value if None not in previous else None)
            if value is None:
                self.script.note(line, f"`{head} {' '.join(words)}` not evaluated: neither branch read")
            return
        if head == "else":
            if self.branches:
                previous = self.branches[-1]
                previous.append(None if None in previous else not any(previous))
            return
        if head == "fi":
            if not self.branches:
                raise MeshplanError(f"{self.script.path}:{line}: `fi` without an `if`.", fix="Check the script's "
                                                                                             "if/fi pairs.")
            self.branches.pop()
            return
        if head == "then" or head == "do":
            raws = raws[1:]
            if not raws:
                return
            head = "".join(t for t, _ in raws[0].parts)
        if not self.active():
            return
        if head in ("export", "local", "declare", "readonly", "typeset"):
            raws = [r for r in raws[1:] if not "".join(t for t, _ in r.parts).startswith("-")]
        assigned = 0
        while assigned < len(raws):
            used = self.assign(raws[assigned:], logical)
            if not used:
                break
            assigned += used
        rest = raws[assigned:]
        if not rest:
            return
        words = [w for r in rest for w in self.expand.words(r, logical.line_at(r.offset))]
        if len(words) > 1 and words[0].text == "eval":
            self.eval(words[1:], line)
            return
        if words and words[0].text in self.functions:
            self.call(words[0].text, words[1:], line)
            return
        if words and words[0].text == "read" and "<<<" in [w.text for w in words]:
            self.read_here_string(words, line)
            return
        if logical.heredoc is not None:
            self.heredoc(words, logical, line)
        self.script.commands.append(Command(words, line))

    def call(self, name: str, args: list[Word], line: int) -> None:
        """A call of a function the script defines: its body read at the first call, as the shell runs it ($1, $2 ...
        and "$@" the call's words; `local` read as an assignment), and each later call only counted: a script calling
        its launch function once per layout (KempnerForge's benchmarks' run_experiment) launches each in turn, and
        meshplan plans one, the first (its commands name every call, `Command.call`, said by the launch readers)."""
        calls = self.calls.setdefault(name, [])
        calls.append((line, args))
        if len(calls) > 1 or self.call_depth >= MAX_EVAL_DEPTH:
            return
        saved = {k: self.script.env.get(k) for k in ("@", "*", "#", *map(str, range(1, 10)))}
        for k in saved:
            self.script.env.pop(k, None)
        for n, word in enumerate(args[:9], start=1):
            self.script.env[str(n)] = Var(word.text, word.line)
        for k in ("@", "*"):
            self.script.env[k] = Var(" ".join(w.text for w in args), line, list(args))
        self.script.env["#"] = Var(str(len(args)), line)
        first = len(self.script.commands)
        self.call_depth += 1
        try:
            for logical in self.functions[name]:
                self.read_line(logical)
        finally:
            self.call_depth -= 1
            for k, var in saved.items():
                if var is None:
                    self.script.env.pop(k, None)
                else:
                    self.script.env[k] = var
        self.first_calls[name] = (first, len(self.script.commands))

    def _said_calls(self) -> None:
        """Each command a function's first call ran, told every call of that function (its first word, the name a
        benchmark script gives each run)."""
        for name, (start, end) in self.first_calls.items():
            calls = self.calls[name]
            shown = "; ".join(f"line {at}: {' '.join(w.text for w in args[:2])}" for at, args in calls[:8]) + (
                f"; and {len(calls) - 8} more" if len(calls) > 8 else "")
            said = (f"{self.script.path}:{calls[0][0]} the function `{name}` is called {len(calls)} time"
                    + ("s" if len(calls) > 1 else "") + f" ({shown}): each call a run; read once, with the first "
                    "call's arguments" + (" (pass the others' fields beside the file to plan them)"
                                          if len(calls) > 1 else ""))
            for command in self.script.commands[start:end]:
                command.call = command.call or said

    def read_loop(self, raws: list[_Raw], line: int) -> bool:
        """`for NAME in WORDS; do ... done` with words the script states: its body read once, NAME the first word,
        and the loop said with every value it runs (a launch script looping over layouts launches each in turn:
        meshplan plans one, the first, and names the others). False where the words are not known (a `$(...)`,
        C-style `for ((...))`): the loop is then skipped as before."""
        texts = ["".join(t for t, _ in r.parts) for r in raws]
        if len(raws) < 3 or texts[2] != "in" or not re.fullmatch(r"[A-Za-z_]\w*", texts[1]) or "done" in texts:
            return False
        items = [w for r in raws[3:] for w in self.expand.words(r, line)]
        if not items or any("$(" in t for t in texts[3:]) or any(
                re.search(r"[*?[]", VAR_REF.sub("", "".join(t for t, q in r.parts if not q))) for r in raws[3:]):
            return False  # a command's output or a glob over files: words the script does not state
        name = texts[1]
        self.script.env[name] = Var(items[0].text, line)
        self.loops.append(name)
        shown = "; ".join(w.text for w in items[:8]) + (f"; and {len(items) - 8} more" if len(items) > 8 else "")
        self.script.loops.append(f"{self.script.path}:{line} `for {name} in ...` runs its body {len(items)} time"
                                 + ("s" if len(items) > 1 else "") + f", {name} = {shown}: read once, with "
                                 f"{name} = {items[0].text}" + (" (pass the others' fields beside the file to plan "
                                                                "them)" if len(items) > 1 else ""))
        return True

    def read_here_string(self, words: list[Word], line: int) -> None:
        """`IFS=',' read -r A B C <<< "$X"`: the names take X's fields split at IFS (the prefix's, else spaces), the
        last one the rest, as the shell's read does (Megatron-Bridge's examples split a PARALLELISM_CONFIG so)."""
        texts = [w.text for w in words]
        k = texts.index("<<<")
        names = [t for t in texts[1:k] if not t.startswith("-")]
        value = " ".join(texts[k + 1:])
        ifs = self.script.env["IFS"].value if "IFS" in self.script.env else " "
        parts = [p for p in re.split("[" + re.escape(ifs or " ") + "]", value)] if ifs.strip() else value.split()
        for n, name in enumerate(names):
            if not re.fullmatch(r"[A-Za-z_]\w*", name):
                continue
            text = (ifs[:1] or " ").join(parts[n:]) if n == len(names) - 1 else (parts[n] if n < len(parts) else "")
            self.script.env[name] = Var(text.strip(), line)

    def assign(self, raws: list[_Raw], logical: _Line) -> int:
        """Records the assignment `raws` starts with (an array takes the words up to its `)`); the words it used."""
        raw = raws[0]
        first = raw.parts[0][0] if raw.parts[0][1] == "" else ""
        m = ASSIGN.match(first)
        if not m:
            return 0
        name, append, rest = m.group(1), m.group(2), m.group(3)
        line = logical.line_at(raw.offset)
        old = self.script.env.get(name)
        if rest.startswith("("):
            members = [_Raw([(rest[1:], ""), *raw.parts[1:]], raw.offset), *raws[1:]]
            items: list[Word] = []
            used = len(raws)
            for k, member in enumerate(members):
                text = member.parts[-1][0] if member.parts[-1][1] == "" else ""
                closes = text.endswith(")")
                if closes:
                    member = _Raw([*member.parts[:-1], (text[:-1], "")], member.offset)
                if any(t for t, _ in member.parts) or any(q for _, q in member.parts):
                    items += self.expand.words(member, logical.line_at(member.offset))
                if closes:
                    used = k + 1
                    break
            items = (old.items or []) + items if append and old is not None else items
            self.script.env[name] = Var(" ".join(w.text for w in items), line, items)
            return used
        tail = _Raw([(rest, ""), *raw.parts[1:]], raw.offset)
        value = "".join(w.text for w in self.expand.words(tail, line)) if rest or len(raw.parts) > 1 else ""
        self.script.env[name] = Var((old.value if append and old else "") + value, line)
        source = "".join(t for t, _ in tail.parts)
        positional = re.fullmatch(r"\$(?:\{([0-9@*])(?::?[-?=][^}]*)?\}|([0-9@*]))", source)
        if positional and self.call_depth == 0 and not value:  # CONFIG="${1:?usage}": the script's own argument
            self.script.arguments[name] = f"${positional.group(1) or positional.group(2)}"
        else:
            self.script.arguments.pop(name, None)
        return 1

    def heredoc(self, words: list[Word], logical: _Line, line: int) -> None:
        body, first = logical.heredoc or ("", line)
        quoted = "<<'" in logical.text
        text = body if quoted else self.expand.text(body, first)
        target = next((words[k + 1].text for k, w in enumerate(words[:-1]) if w.text in (">", ">>")), None)
        target = target or next((w.text[1:] for w in words if w.text.startswith(">") and len(w.text) > 1), None)
        if target:
            self.script.files[target] = (text, first)


def read_script(text: str, path: str = "script") -> Script:
    """The script's variables, heredoc files and the commands it would run, read without running anything."""
    return Reader(text, path).read()
