"""The rule engine behind check_config: the rules card's schema, the condition registry, what a condition sees.

A rule is split in two on purpose. Its words (title, severity, frameworks, message and fix templates,
source) live in cards/rules.yaml, where users search them by id and the skill documents render them.
Its condition is a small Python function tagged with the same id (`@rule`): it returns None when the
plan passes, or the numbers that fill the message and fix templates when it fails. Importing a module
registers nothing: `load_rules()` imports the modules named in RULE_MODULES and indexes their tagged
functions, and refuses to run when an id is in the card and not in the code or the other way round.
Ids never change meaning; each rule's `status` and `since` say how settled it is and when it came.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache, cached_property
from operator import attrgetter, itemgetter
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from meshplan.core.errors import MeshplanError
from meshplan.knowledge.cards import CardError, load_card
from meshplan.rules.context import BACKENDS, Backend, Context, backend_of
from meshplan.schema.choices import FRAMEWORKS, Severity
from meshplan.schema.plan import PLAN_LIST_FIELDS, Job, Plan
from meshplan.schema.reports import Finding

Status = Literal["stable", "preview", "deprecated"]


# --------------------------------------------------------------------------- the card


class RuleSpec(BaseModel):
    """One rule as cards/rules.yaml states it."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^[A-Z]{2,4}\d{3}$", description="Stable id: never reused for another meaning")
    title: str
    severity: Severity
    status: Status = Field(description="stable: settled; preview: wording or threshold may change; "
                                       "deprecated: still runs, to be removed (the id is never reused)")
    since: str = Field(pattern=r"^\d+\.\d+\.\d+$", description="The meshplan version that first shipped the rule")
    memory: bool = Field(False, description="Reads the plan's estimates (the memory one; CP002 the step time): runs "
                                           "after the memory estimate, never in the structural check")
    frameworks: list[str] = Field(description="Framework names, or 'all'")
    backends: list[Backend] = Field(
        default_factory=lambda: list(BACKENDS),
        description="Engines the rule applies to (a framework card's engine.by_zero_stage; see Context.backend)",
    )
    message: str = Field(description="Template filled with the numbers the condition returns")
    fix: str = Field(description="Template naming values that would work")
    source: str = Field(description="Framework file or paper that holds the rule")
    why: str = Field("", description="Why the rule matters, in a sentence or two")
    params: dict[str, float | int] = Field(default_factory=dict, description="Thresholds, with their reason in why")
    unwritable: bool = Field(False, description="Fires where the config render writes has no key for a setting (the "
                                                "framework itself might run it): render's refusal says so, not that "
                                                "the framework would reject the layout")
    no_effect: bool = Field(False, description="A warning that a setting given has no effect on this plan (the "
                                               "framework starts the run and ignores it): the memory and throughput "
                                               "estimates carry it in their warnings too (no_effect_findings)")

    @field_validator("frameworks")
    @classmethod
    def _known_frameworks(cls, value: list[str]) -> list[str]:
        unknown = [f for f in value if f != "all" and f not in FRAMEWORKS]
        if unknown:
            raise ValueError(f"unknown framework(s) {unknown}; allowed: 'all' or {', '.join(FRAMEWORKS)}")
        if not value:
            raise ValueError("a rule must apply to at least one framework")
        return value

    @field_validator("message")
    @classmethod
    def _one_sentence(cls, value: str) -> str:
        """The template ends the sentence (the values it fills are clauses), so every face reads it as it is: the
        search's refusal adds its own sentence after it."""
        if not value.rstrip().endswith((".", "?", "!")):
            raise ValueError(f"a rule message must end its sentence with '.', '?' or '!': {value[-40:]!r}")
        return value

    def applies_to(self, framework: str, backend: str) -> bool:
        return ("all" in self.frameworks or framework in self.frameworks) and backend in self.backends


class RulesCard(BaseModel):
    model_config = ConfigDict(extra="forbid")

    description: str
    rules: list[RuleSpec]

    @field_validator("rules")
    @classmethod
    def _unique_ids(cls, value: list[RuleSpec]) -> list[RuleSpec]:
        seen: set[str] = set()
        for rule in value:
            if rule.id in seen:
                raise ValueError(f"rule id {rule.id} appears twice")
            seen.add(rule.id)
        return value


def rules_card() -> RulesCard:
    return load_card("rules", RulesCard)


@cache
def rule_specs() -> dict[str, RuleSpec]:
    return {r.id: r for r in rules_card().rules}


@cache
def memory_rules() -> frozenset[str]:
    """Ids of the rules that read the memory estimate (`memory: true` in the card)."""
    return frozenset(spec.id for spec in rule_specs().values() if spec.memory)


def unwritable_rules() -> frozenset[str]:
    """Ids of the rules that fire where the rendered config has no key for a setting (`unwritable: true`)."""
    return frozenset(spec.id for spec in rule_specs().values() if spec.unwritable)


# --------------------------------------------------------------------------- the conditions

Values = dict[str, Any] | None  # what a condition returns: None when the rule passes, else its templates' values
Condition = Callable[["Context"], Values]

# The modules that hold the conditions, loaded by load_rules(): the structural ones by family (rules/), then those
# that read the memory estimate (check/). Rules run in card order whatever module holds them.
RULE_MODULES: tuple[str, ...] = (
    "meshplan.rules.world", "meshplan.rules.tensor", "meshplan.rules.sequence", "meshplan.rules.experts",
    "meshplan.rules.attention", "meshplan.rules.frameworks", "meshplan.rules.pipeline", "meshplan.rules.batch",
    "meshplan.rules.precision", "meshplan.rules.recompute", "meshplan.rules.offload", "meshplan.rules.lora",
    "meshplan.rules.rollout", "meshplan.rules.cuda_graphs", "meshplan.check.memory", "meshplan.check.context_parallel",
)


Screen = Callable[[dict[str, Any], Job], Any]  # a plan's field values and its job -> a hashable value


def rule(rule_id: str, reads: tuple[str, ...] | None = None, screen: Screen | None = None,
         words: tuple[str, ...] = ()) -> Callable[[Condition], Condition]:
    """Tag a function as the condition of one rule of cards/rules.yaml; load_rules() collects it. `reads`: every Plan
    field its verdict depends on, directly or through Context (backend: zero_stage; model_parallel: tp, pp, cp;
    expert_grid: pp, ep, etp; microbatches: micro_batch_size, dp, pipeline_microbatches, and the job's
    global_batch_size) and what it calls, and those of JOB_READS it reads; a job's verdicts are kept per their values
    (Verdicts). None: the condition runs on every plan. `screen` (with reads): a coarser value of the plan's fields
    (Plan.__dict__) and its job, equal on two plans of one job only where the rule passes on both or fires on both
    (its words may read all of `reads`): where a rule's reads make every plan distinct (AD001, PP003, PP013) but a few
    of their values decide whether it fires, Verdicts keeps per screen that it passes (RuleGroup.runs, in_parts) and
    runs the condition only on plans whose screen it has not passed. `words` (with reads): the fields only the
    finding's words read beside `reads`, never its verdict (a degree fix naming the batch at the dp it leaves:
    fix_values.BATCH_READS); the kept findings are keyed by both (keyed_reads), while what asks a rule's verdict
    alone (the search's count-free floor and refusals: reads_of) reads `reads`."""
    if screen is not None and reads is None:
        raise ValueError(f"rule {rule_id}: a screen needs the fields the rule reads")

    def tag(fn: Condition) -> Condition:
        fn.rule_id = rule_id  # type: ignore[attr-defined]
        fn.reads = reads  # type: ignore[attr-defined]
        fn.screen = screen  # type: ignore[attr-defined]
        fn.words = words  # type: ignore[attr-defined]
        return fn

    return tag


def reads_of(cond: Condition) -> tuple[str, ...] | None:
    """The fields `rule` tagged the condition with (None: it runs on every plan; an untagged callable reads all)."""
    return getattr(cond, "reads", None)


def keyed_reads(cond: Condition) -> tuple[str, ...] | None:
    """What a rule's kept findings are keyed by: its verdict's reads and its words' (`rule`'s words); None where it
    declares no reads."""
    reads = reads_of(cond)
    return None if reads is None else tuple(dict.fromkeys((*reads, *getattr(cond, "words", ()))))


def screen_of(cond: Condition) -> Screen | None:
    """The condition's screen from `rule` (None where it has none, or is an untagged callable)."""
    return getattr(cond, "screen", None)


@cache
def load_rules() -> dict[str, Condition]:
    """Every rule's condition by id: imports RULE_MODULES and collects their tagged functions, once.

    The card and the code must hold the same ids: a rule with no condition, or a condition with no card
    entry (and so no status or since), is a CardError rather than a rule that silently never runs."""
    found: dict[str, Condition] = {}
    for name in RULE_MODULES:
        module = importlib.import_module(name)
        for fn in vars(module).values():
            rule_id = getattr(fn, "rule_id", None)
            if rule_id is None or getattr(fn, "__module__", None) != name:
                continue
            if rule_id in found:
                raise CardError(f"two conditions for rule {rule_id} ({found[rule_id].__name__}, {fn.__name__})")
            found[rule_id] = fn
    specs = rule_specs()
    only_card, only_code = sorted(set(specs) - set(found)), sorted(set(found) - set(specs))
    if only_card or only_code:
        raise CardError(
            "cards/rules.yaml and the conditions in " + ", ".join(RULE_MODULES) + " disagree: "
            + (f"no condition for {', '.join(only_card)}" if only_card else "")
            + ("; " if only_card and only_code else "")
            + (f"no card entry for {', '.join(only_code)}" if only_code else "")
        )
    unknown = sorted(f"{rule_id}: {name}" for rule_id, fn in found.items() for name in (keyed_reads(fn) or ())
                     if name not in Plan.model_fields and name not in JOB_READS)
    if unknown:
        raise CardError(f"a rule reads a field that is neither a Plan field nor one of {JOB_READS}: "
                        + ", ".join(unknown))
    return {rule_id: found[rule_id] for rule_id in specs}


@cache
def rules_for(framework: str, backend: str, include_memory: bool) -> tuple[tuple[RuleSpec, Condition], ...]:
    """The rules one framework runs, in card order (cached: the search calls check_config thousands of times)."""
    conditions = load_rules()
    return tuple(
        (spec, conditions[spec.id])
        for spec in rule_specs().values()
        if spec.applies_to(framework, backend) and (include_memory or not spec.memory)
    )


@cache
def blocking_rules(framework: str, backend: Backend) -> tuple[tuple[RuleSpec, Condition], ...]:
    """The rules of one framework (on the engine its ZeRO stage selects) that an estimate cannot proceed
    past, in card order: every structural rule of severity error, so a layout `check` refuses is refused by
    the estimators with the same id and fix (one verdict on every face). Cached: the search estimates in
    hot loops."""
    return tuple((spec, condition) for spec, condition in rules_for(framework, backend, False)
                 if spec.severity == "error")


class EstimateBlocked(MeshplanError):
    """An estimate refused because a blocking rule fired: the rule's id, its own message and its own fix."""

    def __init__(self, found: Finding):
        self.rule_id = found.id
        self.finding = found
        super().__init__(f"{found.id}: {found.message}", fix=found.fix)


def require_estimable(job: Job, plan: Plan) -> None:
    """Raise EstimateBlocked for the first blocking rule of the job's framework that the plan breaks.

    The estimators call this instead of validating on their own, so a layout is refused in one wording
    with one threshold, the rule's; `meshplan check` reports every other rule. The job's verdicts answer it
    (Verdicts.first_error: the same rule, its same finding)."""
    found = verdicts(job).first_error(job, plan)
    if found is not None:
        raise EstimateBlocked(found)


def first_blocking(job: Job, plan: Plan) -> Finding | None:
    """The finding of the first blocking rule the plan breaks, each rule run on the plan in card order (what
    require_estimable raises; Verdicts falls back to it where a condition raises)."""
    ctx = Context(job, plan)
    for spec, condition in blocking_rules(job.framework, ctx.backend):
        values = condition(ctx)
        if values is not None:
            return finding(spec, values)
    return None


def structural_findings(job: Job, plan: Plan) -> list[Finding]:
    """Every structural rule's finding on the plan, each rule run on it in card order (what check_config reports
    before the memory rules; Verdicts.findings gives the same list from the job's kept verdicts)."""
    ctx = Context(job, plan)
    return [finding(spec, values) for spec, condition in rules_for(job.framework, ctx.backend, False)
            if (values := condition(ctx)) is not None]


def no_effect_findings(job: Job, plan: Plan) -> list[Finding]:
    """The findings of the job's framework's `no_effect` rules on the plan (settings given that the run ignores): the
    estimates say them in the check's words, so no face answers a knob that changes nothing without a word."""
    ctx = Context(job, plan)
    return [finding(spec, values) for spec, condition in rules_for(job.framework, ctx.backend, False)
            if spec.no_effect and (values := condition(ctx)) is not None]


def job_no_effect_findings(job: Job, plan: Plan) -> list[Finding]:
    """The `no_effect` findings of the rules that read no plan field (reads=()): the same on every plan of the job, so
    a search's answer says them once whatever layouts it ranks (RL008 on the RL recommend)."""
    ctx = Context(job, plan)
    return [finding(spec, values) for spec, condition in rules_for(job.framework, ctx.backend, False)
            if spec.no_effect and reads_of(condition) == () and (values := condition(ctx)) is not None]


def finding(spec: RuleSpec, values: dict[str, Any]) -> Finding:
    try:
        message = spec.message.format(**values)
        fix = spec.fix.format(**values)
    except (KeyError, IndexError, ValueError) as exc:
        raise CardError(
            f"cards/rules.yaml rule {spec.id}: template needs a value the condition did not give ({exc})"
        ) from None
    return Finding(id=spec.id, severity=spec.severity, title=spec.title, message=message, fix=fix,
                   source=spec.source)


# --------------------------------------------------------------------------- one job's verdicts

KEPT_JOBS = 8  # jobs whose verdicts are kept: a search asks one job (and a few with another GPU count)
# The job fields a rule may name in its reads: jobs that differ only in them share one Verdicts (the search asks its
# job's plans again at other global batch sizes), each group that reads one keyed by its value too.
JOB_READS: tuple[str, ...] = ("global_batch_size",)
MEMO_CAP = 1 << 16  # verdicts one group keeps before it starts over (bounds a long-running server's memory)
_job_values = attrgetter(*JOB_READS)
Fired = tuple[tuple[int, Finding], ...]  # (card position, finding) of the rules that fire, in card order


@dataclass(frozen=True)
class RuleGroup:
    """Rules whose verdicts depend on `fields` of the plan and of JOB_READS (or fewer), and those verdicts per the
    fields' values; or one rule with a screen (`@rule(screen=...)`) and its reads, where its verdicts miss answered
    by the screen where it passed (runs)."""

    fields: tuple[str, ...]
    rules: tuple[tuple[int, RuleSpec, Condition], ...]  # (card position, spec, condition)
    memo: dict[Any, Fired]
    screen: Screen | None = None

    @cached_property
    def job_fields(self) -> tuple[str, ...]:
        return tuple(name for name in self.fields if name in JOB_READS)

    @cached_property
    def runs(self) -> Runs:
        """The rules as _fire_kept runs them on a plan the group's verdicts miss: each that reads fewer fields than
        the group with its own verdicts, kept per the values of those (the group misses with any of its fields, the
        rule only with its own: Llama-3.1-70B/64's first ask runs WS002 on 45 values, not on 848 plans). A rule whose
        words read fields its verdict does not (`@rule(words=...)`) keeps where it passes per its reads alone, and its
        findings per its reads and words (where those are fewer than the group's): DeepSeek-V3/2,048's first ask ran
        TP004 (reads tp and tp_comm_overlap, words the batch fields) on 840 plans to pass on every one. A screened
        rule's own verdicts are kept per its screen, where it passes only (_Passes): AD001 runs on 49 screens, not on
        562 layouts and ZeRO stages."""
        fields = frozenset(self.fields)

        def own(cond: Condition) -> OwnVerdicts | None:
            if screen_of(cond) is not None:
                return cond.screen, True, _Passes(), None
            keyed, reads = frozenset(keyed_reads(cond)), frozenset(reads_of(cond))
            worded = RuleGroup(tuple(sorted(keyed)), (), {}) if keyed < fields else None
            if reads < keyed:
                verdict = RuleGroup(tuple(sorted(reads)), (), {})
                return (verdict.key, bool(verdict.job_fields), {},
                        (None, False, {}) if worded is None else (worded.key, bool(worded.job_fields), worded.memo))
            return None if worded is None else (worded.key, bool(worded.job_fields), worded.memo, None)

        return tuple((i, spec, cond, own(cond)) for i, spec, cond in self.rules)

    @cached_property
    def in_parts(self) -> ProgramGroup:
        """The group as the parts of first_errors_over hold it (knob_parts), a screened rule keyed by its screen
        alone, its verdicts kept where it passes: a part misses only on plans the job's search has not asked yet, and
        there the screen answers at once. _fired asks the screened rules together under their reads' key instead
        (_screened_as_one): its plans are asked again warm, where one itemgetter costs less than a screen per rule."""
        if self.screen is None:
            return self.key, self.memo, self.runs, bool(self.job_fields)
        return self.screen, _Passes(), tuple((i, spec, cond, None) for i, spec, cond in self.rules), True

    @cached_property
    def key(self) -> Callable[..., Any]:
        """The memo key from a plan's field values (and the job, where job_fields): itemgetter over the plan's
        fields, a list field as a tuple."""
        plan_key = self.plan_key(tuple(name for name in self.fields if name not in JOB_READS))
        if not self.job_fields:
            return plan_key
        job_values = attrgetter(*self.job_fields)
        return lambda values, job: (job_values(job), plan_key(values))

    @staticmethod
    def plan_key(fields: tuple[str, ...]) -> Callable[[dict[str, Any]], Any]:
        if not fields:
            return lambda values: ()
        get = itemgetter(*fields)
        listed = [i for i, name in enumerate(fields) if name in PLAN_LIST_FIELDS]
        if not listed:
            return get
        if len(fields) == 1:
            return lambda values: (None if (value := get(values)) is None else tuple(value),)

        def key(values: dict[str, Any]) -> tuple:
            got = get(values)
            for i in listed:
                if got[i] is not None:  # copied only where a list field is set (most plans leave it None)
                    return tuple(tuple(v) if j in listed and v is not None else v for j, v in enumerate(got))
            return got

        return key


def rule_groups(rules: tuple[tuple[RuleSpec, Condition], ...]) -> tuple[tuple[RuleGroup, ...], Fired]:
    """The rules (in card order) in groups, one per maximal field set among their reads: each rule with declared reads
    joins the smallest of those that holds its own (those fields decide its verdict too, so one key serves both, and
    the smallest key changes least often: Kimi-K2's layout rules no longer miss with each ZeRO stage AD001 keys);
    each rule with a screen in a group of its own, after them (RuleGroup.screen); the rules without reads are returned
    apart (card position, spec, condition), to run on every plan."""
    declared = [(i, spec, cond, frozenset(keyed_reads(cond))) for i, (spec, cond) in enumerate(rules)
                if reads_of(cond) is not None and screen_of(cond) is None]
    tops: list[frozenset[str]] = []
    for fields in sorted({d[3] for d in declared}, key=lambda f: (-len(f), sorted(f))):
        if not any(fields <= top for top in tops):
            tops.append(fields)
    members: dict[frozenset[str], list] = {top: [] for top in tops}
    for i, spec, cond, fields in declared:
        members[min((top for top in tops if fields <= top), key=len)].append((i, spec, cond))
    always = tuple((i, spec, cond) for i, (spec, cond) in enumerate(rules) if reads_of(cond) is None)
    screened = tuple(RuleGroup(tuple(sorted(keyed_reads(cond))), ((i, spec, cond),), {}, cond.screen)
                     for i, (spec, cond) in enumerate(rules) if screen_of(cond) is not None)
    return tuple(RuleGroup(tuple(sorted(top)), tuple(m), {}) for top, m in members.items()) + screened, always


def _screened_as_one(groups: tuple[RuleGroup, ...]) -> tuple[RuleGroup, ...]:
    """The groups as _fired asks them: the screened rules in one group keyed by all their reads (one lookup per plan
    its verdicts keep, as before they had screens), each still answered by its screen where that misses (runs); the
    parts keep each apart, keyed by its screen (in_parts)."""
    screened = [g for g in groups if g.screen is not None]
    if len(screened) < 2:
        return groups
    rules = tuple(sorted((rule for g in screened for rule in g.rules), key=itemgetter(0)))
    fields = tuple(sorted({name for g in screened for name in g.fields}))
    return (*(g for g in groups if g.screen is None), RuleGroup(fields, rules, {}))


class _Passes(dict):
    """A screened rule's verdicts per screen: kept where it passes (None, or an empty Fired) and never where it fires,
    since its finding's words may read fields its screen does not; a plan whose screen fires finds none and runs the
    rule."""

    def __setitem__(self, key: Any, verdict: Any) -> None:
        if not verdict:
            super().__setitem__(key, verdict)


def _fire(rules: Iterable[tuple[int, RuleSpec, Condition]], ctx: Context) -> Fired:
    return tuple((i, finding(spec, values)) for i, spec, cond in rules if (values := cond(ctx)) is not None)


# A rule's own verdicts (RuleGroup.runs): its key from the plan's values (and the job where it reads JOB_READS),
# whether the key reads the job, its verdict per key (its finding, or None where it passes), and None; for a rule with
# words, the key is its reads', the memo keeps where it passes only, and the last item is its findings' key (None: the
# group's own key is its findings', so the group's verdicts keep them), whether that reads the job, its findings per
# key.
WordedVerdicts = tuple[Callable[..., Any] | None, bool, dict[Any, Any]]
OwnVerdicts = tuple[Callable[..., Any], bool, dict[Any, Any], WordedVerdicts | None]
# A group's rules as _fire_kept runs them: (card position, spec, condition, its own verdicts or None where the group's
# key is its own).
Runs = tuple[tuple[int, RuleSpec, Condition, OwnVerdicts | None], ...]

def _keep(memo: dict[Any, Any], key: Any, verdict: Any) -> Any:
    """`verdict` kept in `memo` under `key` (a memo of MEMO_CAP verdicts starts over first), and returned: every kept
    verdict's store, asked on a miss only."""
    if len(memo) >= MEMO_CAP:
        memo.clear()
    memo[key] = verdict
    return verdict


def _fire_kept(runs: Runs, values: dict[str, Any], job: Job, ctx: _Ctx) -> Fired:
    """_fire over a group's rules, each with its own verdicts (RuleGroup.runs) answered from them where kept."""
    out = []
    for i, spec, cond, own in runs:
        if own is None:
            found = cond(ctx.get())
            hit = None if found is None else (i, finding(spec, found))
        else:
            key, reads_job, memo, words = own
            key = key(values, job) if reads_job else key(values)
            hit = memo.get(key, False)
            if hit is False:
                if words is None:
                    found = cond(ctx.get())
                    hit = _keep(memo, key, None if found is None else (i, finding(spec, found)))
                else:
                    hit = _worded(i, spec, cond, (key, memo), words, values, job, ctx)
        if hit is not None:
            out.append(hit)
    return tuple(out)


def _worded(i: int, spec: RuleSpec, cond: Condition, passes: tuple[Any, dict[Any, Any]], words: WordedVerdicts,
            values: dict[str, Any], job: Job, ctx: _Ctx) -> tuple[int, Finding] | None:
    """The verdict of a rule with words on a plan its reads' key (passes: key, memo) has not seen pass: its kept
    finding where its reads and words were seen firing (words: their key, whether it reads the job, the findings per
    key; no key: the group keeps them), else the rule run, kept per its reads where it passes, per its reads and words
    where it fires."""
    word_key, reads_job, found_memo = words
    if word_key is not None:
        word_key = word_key(values, job) if reads_job else word_key(values)
        hit = found_memo.get(word_key, False)
        if hit is not False:
            return hit
    found = cond(ctx.get())
    if found is None:
        return _keep(passes[1], passes[0], None)
    hit = (i, finding(spec, found))
    return hit if word_key is None else _keep(found_memo, word_key, hit)


class _Ctx:
    """One plan's Context, made when a rule first runs on it (a Plan, or a _Lazy that builds it then)."""

    __slots__ = ("ctx", "job", "plan")

    def __init__(self, job: Job, plan: Plan | _Lazy):
        self.job, self.plan, self.ctx = job, plan, None

    def get(self) -> Context:
        if self.ctx is None:
            plan = self.plan
            self.ctx = Context(self.job, plan if isinstance(plan, Plan) else plan.plan())
        return self.ctx


# A ZeRO stage's program: its groups as _fired asks them (key, memo, runs, whether the key reads the job), the rules
# run on every plan, and those of its groups that hold an error rule (first_error's).
Program = tuple[tuple[tuple[Callable[..., Any], dict[Any, Fired], Runs, bool], ...], Fired,
                tuple[tuple[Callable[..., Any], dict[Any, Fired], Runs, bool], ...]]


def _has_error(group: RuleGroup) -> bool:
    """Whether one of the group's rules is of severity error (one a first error can come from)."""
    return any(spec.severity == "error" for _, spec, _ in group.rules)


# A blocking rule as Verdicts.passes and Verdicts.fires ask it: its condition, its verdicts' key (None: asked on
# every plan), whether the key reads the job (JOB_READS), its verdict (fires) per key.
BlockingVerdicts = tuple[Condition, Callable[..., Any] | None, bool, dict[Any, bool]]


def _blocks(entry: BlockingVerdicts, job: Job, values: dict[str, Any], ctx: _Ctx) -> bool:
    """Whether one blocking rule fires on the plan whose field values are `values`, from its verdict kept per what the
    rule declares decides it: its screen where it has one (`@rule(screen=...)`: fires and passes alike, its words
    are no part of a verdict), else the values of its reads (reads_of), every plan where it declares none; run on
    the plan (ctx) where not kept."""
    cond, key, reads_job, memo = entry
    if key is None:
        return cond(ctx.get()) is not None
    k = key(values, job) if reads_job else key(values)
    fires = memo.get(k)
    if fires is None:
        fires = _keep(memo, k, cond(ctx.get()) is not None)
    return fires


class Verdicts:
    """The structural rules' verdicts on one job's plans, each group's kept per the values of the plan fields its
    rules read (`@rule(reads=...)`): a search asks thousands of plans that differ in a few fields (degrees, micro-batch,
    recompute, ZeRO stage) and most rules read few of them. The answers are structural_findings' and first_blocking's
    (the same findings, in card order): where a condition raises, those run the plan instead (and raise as before).
    The findings are shared by the reports that hold them: read them, never change them in place."""

    def __init__(self, job: Job):
        self.job = job  # the first job asked; others differ from it in JOB_READS only
        self._programs: dict[str, Program] = {}  # per engine (Context.backend)
        self._by_zero: dict[int, Program] = {}
        self._groups: dict[str, tuple[RuleGroup, ...]] = {}  # per engine: its program's groups
        self._parts: dict[tuple[Any, tuple[str, ...]], tuple[Part, ...] | None] = {}  # per ZeRO stage/engine, knobs
        # first_errors_over's parts per ZeRO stage, knobs and the knobs that differ: (those reading none, the others)
        self._splits: dict[tuple[int, tuple[str, ...], frozenset[str]], tuple[tuple[Part, ...], ...] | None] = {}
        self._blocking_rules: dict[int, dict[str, BlockingVerdicts]] = {}  # blocking rules per ZeRO stage

    def _program(self, zero_stage: int) -> Program:
        """Each group of the rules the plan's engine runs as (key, memo, rules), and the rules run on every plan."""
        hit = self._by_zero.get(zero_stage)
        if hit is None:
            backend = backend_of(self.job.card, zero_stage)
            hit = self._programs.get(backend)
            if hit is None:
                groups, always = rule_groups(rules_for(self.job.framework, backend, False))
                self._groups[backend] = groups
                program = [(g.key, g.memo, g.runs, bool(g.job_fields)) for g in _screened_as_one(groups)]
                hit = self._programs[backend] = (
                    tuple(program), always,
                    tuple(p for g, p in zip(_screened_as_one(groups), program, strict=True) if _has_error(g)))
            self._by_zero[zero_stage] = hit
        return hit

    def _fired(self, job: Job, plan: Plan, errors: bool = False) -> list[tuple[int, Finding]]:
        """The findings of the rules that fire on the plan (card position, finding), in card order; `errors`: of the
        groups that hold an error rule only (first_error's: a group of warnings alone decides no first error)."""
        program = self._program(plan.zero_stage)
        groups, always = program[2] if errors else program[0], program[1]
        values = plan.__dict__
        ctx = _Ctx(job, plan)
        fired: list[tuple[int, Finding]] = []
        for key, memo, runs, reads_job in groups:
            key = key(values, job) if reads_job else key(values)
            hit = memo.get(key)
            if hit is None:
                hit = _keep(memo, key, _fire_kept(runs, values, job, ctx))
            if hit:
                fired.extend(hit)
        if always:
            fired.extend(_fire(always, ctx.get()))
        if len(fired) > 1:
            fired.sort(key=itemgetter(0))
        return fired

    def findings(self, job: Job, plan: Plan) -> list[Finding]:
        """structural_findings(job, plan), from the kept verdicts (job: this one's, or one differing in JOB_READS)."""
        try:
            fired = self._fired(job, plan)
        except Exception:  # the plain run raises it again, or finds a blocking rule before it
            return structural_findings(job, plan)
        return [found for _, found in fired]

    def first_error(self, job: Job, plan: Plan) -> Finding | None:
        """first_blocking(job, plan), from the kept verdicts (job: as findings)."""
        try:
            fired = self._fired(job, plan, errors=True)
        except Exception:  # as findings
            return first_blocking(job, plan)
        return next((found for _, found in fired if found.severity == "error"), None)

    def _blocking(self, zero_stage: int) -> dict[str, BlockingVerdicts]:
        """The blocking rules of the plan's engine (its ZeRO stage's) by id, in card order: (condition, key, whether
        the key reads the job, its verdicts per key), once per ZeRO stage; passes and fires read them."""
        hit = self._blocking_rules.get(zero_stage)
        if hit is None:
            hit = self._blocking_rules[zero_stage] = {}
            for spec, cond in blocking_rules(self.job.framework, backend_of(self.job.card, zero_stage)):
                screen, fields = screen_of(cond), reads_of(cond)
                if screen is not None:
                    hit[spec.id] = (cond, screen, True, {})
                elif fields is None:
                    hit[spec.id] = (cond, None, False, {})
                else:
                    group = RuleGroup(tuple(sorted(fields)), (), {})
                    hit[spec.id] = (cond, group.key, bool(group.job_fields), {})
        return hit

    def passes(self, job: Job, plan: Plan) -> bool:
        """Whether the plan breaks no blocking rule (first_error is None: the structural check's report is ok,
        CheckReport.ok without the memory rules; job: as findings), from each blocking rule's verdict alone
        (_blocks, as fires asks it). A rule that fires is not run again on each plan with its key, as findings' kept
        verdicts run it again for its finding's words: what the exhaustive oracle asks of every plan it builds
        (search/oracle.py; 26-30% slower on findings' verdicts). Held to check's ok by tests/test_search_oracle.py;
        where a condition raises, first_blocking answers (it raises again, or finds its error first)."""
        values, ctx = plan.__dict__, _Ctx(job, plan)
        try:
            for entry in self._blocking(plan.zero_stage).values():
                if _blocks(entry, job, values, ctx):
                    return False
        except Exception:  # as findings
            return first_blocking(job, plan) is None
        return True

    def fires(self, job: Job, plan: Plan, rule_id: str) -> bool:
        """Whether the blocking rule `rule_id` fires on the plan (job: as findings): False where the job's framework
        does not run it on the plan's engine (blocking_rules at its ZeRO stage), else its verdict as passes keeps it
        (_blocks: one memo per rule, which both read). What the search's refusal proves a blocker with over a whole
        space (search/refusal.blocking_rule: AD001 on a few dozen screens of 170,288 plans) and its EP overlap probe
        asks of the rules that refuse the overlap (search/plans.a2a_overlap). A condition that raises raises here."""
        entry = self._blocking(plan.zero_stage).get(rule_id)
        return entry is not None and _blocks(entry, job, plan.__dict__, _Ctx(job, plan))

    def _parts_of(self, zero_stage: int, knobs: tuple[str, ...]) -> tuple[Part, ...] | None:
        """The groups of the plan's engine in parts by the knob fields they read (knob_parts), once per engine and
        knobs; None where a rule runs on every plan."""
        hit = self._parts.get((zero_stage, knobs), False)
        if hit is False:
            always = self._program(zero_stage)[1]
            backend = backend_of(self.job.card, zero_stage)
            hit = self._parts.get((backend, knobs), False)
            if hit is False:
                hit = self._parts[(backend, knobs)] = None if always else knob_parts(self._groups[backend], knobs)
            self._parts[(zero_stage, knobs)] = hit
        return hit

    def first_error_of(self, job: Job, knobs: dict[str, Any], base: Plan | None,
                       build: Callable[[], Plan]) -> Finding | None:
        """The first error of findings(job, plan) for the plan build() makes, from each part's kept first error
        (knob_parts), keyed by the values of the fields its rules read: the plan's values are base's (a plan that
        differs from it in `knobs` only, field -> value) updated with the knobs, so the plan is built only where a
        group's verdict is not kept (base None: built). Where a condition raises, the plan's own findings answer (as
        findings: the plain run raises again or finds its error)."""
        parts = self._parts_of(knobs["zero_stage"], tuple(knobs))
        if parts is None:
            return next((f for f in self.findings(job, build()) if f.severity == "error"), None)
        plans = _Lazy(base.__dict__ | knobs if base is not None else None, build)
        try:
            first = _first_of_parts(parts, job, plans.values(), plans.plan)
        except Exception:  # as findings
            return next((f for f in structural_findings(job, plans.plan()) if f.severity == "error"), None)
        return None if first is None else first[1]

    def first_errors_over(self, job: Job, variants: list[dict[str, Any]], base: Plan | None,
                          builds: list[Callable[[], Plan]]) -> list[Finding | None]:
        """first_error_of for each of plans that differ from one another in a few knobs (a layout's recomputes at one
        ZeRO stage and micro-batch, with the EP overlap each allows): the parts whose rules read none of the knobs
        that differ answer every variant as they answer the first, so only the others are asked per variant."""
        head = variants[0]
        names = tuple(head)
        changed = frozenset(name for knobs in variants[1:] for name in names if knobs[name] != head[name])
        split = self._splits.get((head["zero_stage"], names, changed), False)
        if split is False:
            parts = self._parts_of(head["zero_stage"], names)
            split = self._splits[(head["zero_stage"], names, changed)] = None if (
                parts is None or "zero_stage" in changed) else (tuple(p for p in parts if not p[4] & changed),
                                                               tuple(p for p in parts if p[4] & changed))
        if split is None or base is None:
            return [self.first_error_of(job, k, base, b) for k, b in zip(variants, builds, strict=True)]
        common, varying = split
        values = base.__dict__ | head  # updated in place with each variant's knobs: the keys read it, not the plans
        out: list[Finding | None] = []
        try:
            shared = _first_of_parts(common, job, values, builds[0])
            for knobs, build in zip(variants, builds, strict=True):
                values.update(knobs)
                own = _first_of_parts(varying, job, values, build)
                first = own if shared is None or (own is not None and own[0] < shared[0]) else shared
                out.append(None if first is None else first[1])
        except Exception:  # a condition raised: each variant as first_error_of answers it
            return [self.first_error_of(job, k, base, b) for k, b in zip(variants, builds, strict=True)]
        return out


def _first_of_parts(parts: tuple[Part, ...], job: Job, values: dict[str, Any],
                    build: Callable[[], Plan]) -> tuple[int, Finding] | None:
    """The first error (card position, finding) of the parts' kept first errors on the plan whose field values are
    `values` (asked where not kept, on the plan build() makes, built once and only then); a condition that raises
    raises here."""
    first: tuple[int, Finding] | None = None
    plans: _Lazy | None = None
    for key, reads_job, memo, groups, _ in parts:
        key = key(values, job) if reads_job else key(values)
        hit = memo.get(key, False)
        if hit is False:
            plans = plans or _Lazy(values, build)
            hit = _keep(memo, key, _part_error(groups, job, plans))
        if hit is not None and (first is None or hit[0] < first[0]):
            first = hit
    return first


ProgramGroup = tuple[Callable[..., Any], dict[Any, Fired], Runs, bool]
# A part of a program's groups: its key (from the plan's values, and the job where it reads JOB_READS), whether it
# reads JOB_READS, its first errors per key (card position, finding; None: no error), its groups as a program's, the
# knob fields they read.
Part = tuple[Callable[..., Any], bool, dict[Any, tuple[int, Finding] | None], tuple[ProgramGroup, ...], frozenset[str]]


def knob_parts(groups: tuple[RuleGroup, ...], knobs: tuple[str, ...]) -> tuple[Part, ...]:
    """The groups that hold an error rule in parts: those that read no knob, then one part per maximal set of the knob
    fields the others read (a group joins the smallest that holds its own, as rule_groups does with fields); a group
    of warnings alone gives no first error, and its fields would only widen its part's key. A part's first error is
    decided by every field its groups read (its key), so one lookup answers the part; grouped by the knobs they read,
    the groups of a part change key together (a search's plans of one layout differ in the knobs), and the rules that
    read only the layout's fields miss once per layout."""
    groups = tuple(g for g in groups if _has_error(g))  # a part keeps first errors: warnings alone decide none
    reads = [frozenset(g.fields) & frozenset(knobs) for g in groups]
    tops: list[frozenset[str]] = [frozenset()] if frozenset() in reads else []
    for fields in sorted(set(reads) - {frozenset()}, key=lambda f: (-len(f), sorted(f))):
        if not any(fields <= top for top in tops if top):
            tops.append(fields)
    members: dict[frozenset[str], list[RuleGroup]] = {top: [] for top in tops}
    for group, fields in zip(groups, reads, strict=True):
        members[min((top for top in tops if fields <= top and (top or not fields)), key=len)].append(group)
    out = []
    for top, member in members.items():
        union = RuleGroup(tuple(sorted({name for g in member for name in g.fields})), (), {})
        out.append((union.key, bool(union.job_fields), {},
                    tuple(g.in_parts for g in member), top))
    return tuple(out)


class _Lazy:
    """One plan's field values and the plan, each made once when first asked: the values given (a base plan's updated
    with the knobs), else the plan's own."""

    def __init__(self, values: dict[str, Any] | None, build: Callable[[], Plan]):
        self._values, self.build = values, build
        self._plan: Plan | None = None

    def plan(self) -> Plan:
        if self._plan is None:
            self._plan = self.build()
        return self._plan

    def values(self) -> dict[str, Any]:
        if self._values is None:
            self._values = self.plan().__dict__
        return self._values


def _part_error(groups: tuple[ProgramGroup, ...], job: Job, plans: _Lazy) -> tuple[int, Finding] | None:
    """The first error (card position, finding) among the groups' kept verdicts on the plan (run where not kept)."""
    values = plans.values()
    ctx = _Ctx(job, plans)
    first: tuple[int, Finding] | None = None
    for key, memo, runs, reads_job in groups:
        key = key(values, job) if reads_job else key(values)
        hit = memo.get(key)
        if hit is None:
            hit = _keep(memo, key, _fire_kept(runs, values, job, ctx))
        error = next(((i, found) for i, found in hit if found.severity == "error"), None) if hit else None
        if error is not None and (first is None or error[0] < first[0]):
            first = error
    return first


_kept: dict[tuple, Verdicts] = {}  # by job_key, the most recently asked last
_last: list[tuple[Job, Verdicts]] = []
# The jobs asked lately, by identity (each entry holds its job, so its id stays its own): a search asks its job and a
# few copies of it with other global batch sizes (its per-token references' jobs) in turn, each found without its key.
_recent: dict[int, tuple[Job, Verdicts]] = {}
RECENT_JOBS = 32  # entries _recent holds at most (cleared when full)


def job_key(job: Job) -> tuple:
    """The job's field values but JOB_READS (a nested record by identity: the kept Verdicts' job holds it, so the id
    stays its)."""
    return tuple(id(v) if isinstance(v, BaseModel) else tuple(v) if isinstance(v, list) else v
                 for name, v in job.__dict__.items() if name not in JOB_READS)


def verdicts(job: Job) -> Verdicts:
    """The job's Verdicts, kept for the last KEPT_JOBS jobs asked (by value: a copy of the job, or one with another
    global batch size, finds them); ask them with the job itself (findings, first_error)."""
    if _last and _last[0][0] is job:
        return _last[0][1]
    seen = _recent.get(id(job))
    if seen is not None and seen[0] is job:
        _last[:] = [seen]
        return seen[1]
    key = job_key(job)
    hit = _kept.pop(key, None)
    if hit is None:
        hit = Verdicts(job)
        if len(_kept) >= KEPT_JOBS:
            _kept.pop(next(iter(_kept)), None)
    _kept[key] = hit
    if len(_recent) >= RECENT_JOBS:
        _recent.clear()
    _recent[id(job)] = entry = (job, hit)
    _last[:] = [entry]
    return hit
