"""The CRD's CEL rules agree with the Python validator, case by case.

Every rule is evaluated with a real CEL implementation (``common-expression-language``,
the Rust ``cel`` crate) on the validator's own table (``pool_cases.py``). Structural
cases are checked against the CRD's ``openAPIV3Schema`` with jsonschema, as the API
server rejects them before any CEL rule runs.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Mapping
from typing import Any

import cel
import jsonschema
import pytest
from pool_cases import SEMANTIC_CASES, STRUCTURAL_CASES

from substrate_gpu.pools import Code, crd, rules, validate_document
from substrate_gpu.pools.problems import APISERVER_CODES, STRUCTURAL_CODES, WARNING_CODES

PROGRAMS = [(rule, cel.compile(rule.rule)) for rule in rules.RULES]


def cel_codes(doc: Mapping[str, Any]) -> set[Code]:
    """The codes of the CEL rules that reject ``doc`` (an erroring rule fails the test)."""
    failed: set[Code] = set()
    for rule, program in PROGRAMS:
        scope = doc if rule.scope == "root" else doc["spec"]
        try:
            result = program.execute({"self": scope})
        except Exception as e:  # an evaluation error is a rule bug, not a verdict
            pytest.fail(f"CEL rule for {rule.code} errored on {scope!r}: {e}\n{rule.rule}")
        assert isinstance(result, bool), f"rule {rule.code} returned {result!r}"
        if not result:
            failed.add(rule.code)
    return failed


@pytest.mark.parametrize(("doc", "codes"), SEMANTIC_CASES)
def test_cel_agrees_with_python(doc: dict, codes: set[Code]) -> None:
    """CEL and Python report the same codes, and both the expected ones."""
    python = {p.code for p in validate_document(doc).errors}
    assert (cel_codes(doc), python) == (codes, codes)


def _worded_by(message: rules.Message, text: str) -> bool:
    """Whether ``text`` is ``message``'s template with its placeholders filled."""
    pattern = "".join(
        re.escape(literal) + ("(.+)" if name else "")
        for literal, name, _, _ in string.Formatter().parse(message.template)
    )
    return re.fullmatch(pattern, text) is not None


@pytest.mark.parametrize(("doc", "codes"), SEMANTIC_CASES)
def test_each_problem_is_worded_by_a_failing_rule_of_its_field(doc: dict, codes: set[Code]) -> None:
    """Every problem's field and message are those of a CEL rule that fails on the document."""
    failing = [
        rule
        for rule, program in PROGRAMS
        if program.execute({"self": doc if rule.scope == "root" else doc["spec"]}) is False
    ]
    for problem in validate_document(doc).errors:
        assert any(
            (rule.code, rule.path) == (problem.code, problem.path)
            and _worded_by(rule.message, problem.message)
            for rule in failing
        ), problem


def test_a_message_with_values_is_one_cel_format_call() -> None:
    """Literal text is escaped for CEL and format(); values are printed with %s."""
    message = rules.Message('50% "of" {count}', {"count": "self.n * 2"})
    assert message.cel() == '"50%% \\"of\\" %s".format([self.n * 2])'
    assert message.format(count=4) == '50% "of" 4'
    assert message.to_validation() == {"messageExpression": message.cel()}
    assert rules.Message("fixed").to_validation() == {"message": "fixed"}


def test_every_semantic_code_has_a_cel_rule() -> None:
    """Each semantic check of the validator is enforced by the API server too."""
    semantic = set(Code) - STRUCTURAL_CODES - APISERVER_CODES - WARNING_CODES
    assert {rule.code for rule in rules.RULES} == semantic


def test_every_rule_is_exercised_by_a_failing_case() -> None:
    """No CEL rule is dead: some case in the table makes each one fail."""
    fired: set[str] = set()
    for param in SEMANTIC_CASES:
        doc = param.values[0]
        for rule, program in PROGRAMS:
            scope = doc if rule.scope == "root" else doc["spec"]
            if program.execute({"self": scope}) is False:
                fired.add(rule.rule)
    assert [(r.path, r.message.template) for r in rules.RULES if r.rule not in fired] == []


def _schema_validator() -> jsonschema.Draft202012Validator:
    version = crd.render_crd()["spec"]["versions"][0]  # type: ignore[index]
    return jsonschema.Draft202012Validator(version["schema"]["openAPIV3Schema"])


def _failed_checks(errors: Iterable[jsonschema.ValidationError]) -> set[str]:
    """The schema keywords that failed, those under an ``anyOf`` included."""
    return {str(e.validator) for e in errors} | {
        check for e in errors for check in _failed_checks(e.context or [])
    }


@pytest.mark.parametrize(
    ("doc", "codes", "check"),
    # A schema prunes unknown fields rather than refusing them (strict decoding refuses).
    [case for case in STRUCTURAL_CASES if case.values[2] != "unknown"],
)
def test_crd_schema_rejects_structural_cases(doc: dict, codes: set[Code], check: str) -> None:
    """What the validator calls ill-typed, the CRD's schema rejects too, by that check."""
    assert codes <= STRUCTURAL_CODES
    assert check in _failed_checks(list(_schema_validator().iter_errors(doc)))


@pytest.mark.parametrize(("doc", "codes"), SEMANTIC_CASES)
def test_crd_schema_accepts_semantic_cases(doc: dict, codes: set[Code]) -> None:
    """Semantic cases are well typed: only CEL decides them."""
    assert [e.message for e in _schema_validator().iter_errors(doc)] == []
