"""A Lark grammar (llguidance's dialect) for a reply that is a DSML tool-call block (chat_encoding.md §6.3), so
`tool_choice: "required"` or a named function can be enforced (dsv4.engine.structured).

    tool_call_grammar(tools, dsml_id, only=None, parallel=True) -> str

The block is exactly what the encoder renders for calls: `"\\n\\n<｜DSML｜tool_calls>\\n"`, invokes joined by
`"\\n"`, `"\\n</｜DSML｜tool_calls>"`. Each invoke names one of `tools` (or `only`) and lists its parameters in
the schema's property order, the required ones always: a string-typed property as `string="true"` and raw text
(its `enum` if it has one; the text may hold `</`, only `</` + the special token ends it), any other as
`string="false"` and JSON following the property's schema, laid out as json.dumps does. `｜DSML｜` is a special
token: the grammar names it by id (`<[id]>`), so only that token, never its spelling in ordinary pieces, matches.

llguidance's lexer is greedy and does not backtrack: a literal that is a prefix of another literal allowed at the
same point ("\\n" and "\\n</") would be extended into the longer one and fail where the shorter was meant. So
"\\n" is always a literal of its own and "<" / "</" are followed by the special token, where neither extends.
The same greediness ends a raw value: its lexeme takes text up to a "</" and goes on while text follows; only the
special token, which no regex matches (llguidance: special tokens cannot be used in terminals), stops it there.
"""
from __future__ import annotations

import json
import re
from typing import Any

# json.dumps' layout (the encoder's §6.1): no free whitespace, so values end where the encoder's would
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# raw text and the "</" of its closing tag, greedy: a "</" followed by more text stays in the value, so it ends
# only at a "</" the special token follows (a lazy `suffix="</"` would end it at the first "</"; llguidance refuses
# a special token as `suffix` or `stop`)
RAW_TEXT_RULE = 'raw_text: /(.|\\n)*<\\//'


def _lit(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)  # Lark string literals take JSON's escapes


def _types(schema: dict) -> set[str]:
    t = schema.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list):
        return {x for x in t if isinstance(x, str)}
    if isinstance(schema.get("enum"), list) and schema["enum"] and all(isinstance(v, str) for v in schema["enum"]):
        return {"string"}
    return set()


def _param(name: str, schema: Any, dsml: str) -> str:
    """One parameter's alternatives: `<D parameter name="K" string="true|false">VALUE</D parameter>`."""
    schema = schema if isinstance(schema, dict) else {}
    head = f'"<" {dsml} ' + _lit(f'parameter name="{name}" string=')
    tail = f'"</" {dsml} "parameter>"'
    types, alts = _types(schema), []
    if "string" in types:
        enum = schema.get("enum")
        if isinstance(enum, list) and any(isinstance(v, str) for v in enum):
            alts.append(f'{head} "\\"true\\">" (' + " | ".join(_lit(v) for v in enum if isinstance(v, str))
                        + f") {tail}")
        else:  # raw_text ends with the "</" itself
            alts.append(f'{head} "\\"true\\">" raw_text {dsml} "parameter>"')
    if types != {"string"}:
        rest = {k: v for k, v in schema.items() if k != "x-guidance"}
        if "string" in types:  # the string form is the other alternative
            rest["type"] = sorted(types - {"string"})
        rest["x-guidance"] = JSON_LAYOUT
        alts.append(f'{head} "\\"false\\">" %json {json.dumps(rest)} {tail}')
    return " | ".join(f"({a})" for a in alts)


def _params(parameters: Any, dsml: str, rules: list[str], prefix: str) -> str:
    """The rule text after an invoke's `>`: `("\\n" param)+` in property order, or `"\\n"` when none is given."""
    props = parameters.get("properties") if isinstance(parameters, dict) else None
    if not isinstance(props, dict) or not props:
        return '"\\n"'
    required = set(parameters.get("required") or []) if isinstance(parameters.get("required"), list) else set()
    names = []
    for i, (key, schema) in enumerate(props.items()):
        rules.append(f"{prefix}_p{i}: {_param(str(key), schema, dsml)}")
        names.append((f'"\\n" {prefix}_p{i}', key in required))
    if any(req for _, req in names):
        return " ".join(n if req else f"({n})?" for n, req in names)
    # all optional: at least one of them (in order), or none (a second "\n")
    alts = [" ".join([n] + [f"({m})?" for m, _ in names[i + 1:]]) for i, (n, _) in enumerate(names)]
    return "(" + " | ".join(f"({a})" for a in alts) + ') | "\\n"'


def tool_call_grammar(tools: list[dict], dsml_id: int, *, only: str | None = None, parallel: bool = True) -> str:
    """The Lark grammar of a reply made of one DSML tool-call block calling `tools` (OpenAI tool dicts; `only`: just
    that function). parallel=False: exactly one invoke."""
    dsml = f"<[{int(dsml_id)}]>"
    rules: list[str] = []
    invokes = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") or {}
        name = fn.get("name")
        if not isinstance(name, str) or (only is not None and name != only):
            continue
        if not re.fullmatch(r"[^\"<>\n]+", name):
            raise ValueError(f"tool name {name!r} cannot be enforced in a DSML call")
        body = _params(fn.get("parameters"), dsml, rules, f"t{i}")
        rules.append(f'invoke_{i}: "<" {dsml} ' + _lit(f'invoke name="{name}">') + f" ({body}) "
                     f'"\\n" "</" {dsml} "invoke>"')
        invokes.append(f"invoke_{i}")
    if not invokes:
        raise ValueError(f"no tool named {only!r}" if only is not None else "no tools to call")
    calls = "invoke" if not parallel else 'invoke ("\\n" invoke)*'
    head = [f'start: "\\n" "\\n" "<" {dsml} "tool_calls>" "\\n" {calls} "\\n" "</" {dsml} "tool_calls>"',
            "invoke: " + " | ".join(invokes), RAW_TEXT_RULE]
    return "\n".join(head + rules) + "\n"
