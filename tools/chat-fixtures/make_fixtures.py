#!/usr/bin/env python3
"""Reference renderings of real chat templates, for kiln/chat's tests.

Every template in TEMPLATES (read from ../shared/tokenizers, never copied into
the repository) is rendered over the conversations in CONVERSATIONS, each with
add_generation_prompt false and true, by jinja2 configured exactly as Hugging
Face transformers does in `_compile_jinja_template`
(transformers/utils/chat_template_utils.py):

  * ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
    extensions=[<generation tag>, jinja2.ext.loopcontrols])
  * filters["tojson"] = json.dumps(x, ensure_ascii=False, indent=...,
    separators=..., sort_keys=...)
  * globals["raise_exception"] raises jinja2.exceptions.TemplateError(msg)
  * globals["strftime_now"](fmt) = datetime.now().strftime(fmt) -- frozen here
    to NOW so that Go can render the same date
  * render(messages=..., tools=<list or None>, documents=None,
    add_generation_prompt=..., bos_token=..., eos_token=..., **extra), the
    special tokens coming from the tokenizer config when it has them.

A rendering that raises is recorded as {"error": message, "raised": true} for
raise_exception, {"error": "Type: message", "raised": false} otherwise.

Usage: python3 tools/chat-fixtures/make_fixtures.py [--shared ../shared] [--out testdata/chat/expected.json]
Needs only jinja2 (>= 3.1), as transformers does.
"""

import argparse
import datetime
import json
import os
import sys

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

# The instant strftime_now reports; kiln/chat's tests pass the same one.
NOW = datetime.datetime(2025, 3, 9, 14, 5, 7)

# name -> (path under ../shared/tokenizers, bos, eos). A path ending in
# tokenizer_config.json means its "chat_template"; bos/eos None means "take
# them from that tokenizer_config.json" (absent there: not passed at all).
# Bare .jinja files have no config, so they get their family's usual tokens.
TEMPLATES = {
    "chatml-default-system": ("chat-templates/chatml-default-system.jinja", "<|im_start|>", "<|im_end|>"),
    "gemma-instruct": ("chat-templates/gemma-instruct.jinja", "<bos>", "<eos>"),
    "llama3-instruct": ("chat-templates/llama3-instruct.jinja", "<|begin_of_text|>", "<|eot_id|>"),
    "llama3.1-instruct-tools": ("chat-templates/llama3.1-instruct-tools.jinja", "<|begin_of_text|>", "<|eot_id|>"),
    "mistral-instruct-a": ("chat-templates/mistral-instruct-a.jinja", "<s>", "</s>"),
    "mistral-instruct-b": ("chat-templates/mistral-instruct-b.jinja", "<s>", "</s>"),
    "phi-3-a": ("chat-templates/phi-3-a.jinja", "<s>", "<|endoftext|>"),
    "phi-3-b": ("chat-templates/phi-3-b.jinja", "<s>", "<|endoftext|>"),
    "phi-3-c": ("chat-templates/phi-3-c.jinja", "<s>", "<|endoftext|>"),
    "zephyr": ("chat-templates/zephyr.jinja", "<s>", "</s>"),
    # Gemma 2 renders with gemma-instruct; Gemma 3's own (system turns
    # folded into the first user turn), entry 22 of ollama's index.
    "gemma3-instruct": ("chat-templates/ollama-template-index.json#22", "<bos>", "<eos>"),
    "phi-3-mini": ("phi-3-mini/tokenizer_config.json", None, None),
    "qwen2.5-instruct": ("qwen2.5-instruct/tokenizer_config.json", None, None),
    "qwen3": ("qwen3/tokenizer_config.json", None, None),
    "smollm3": ("smollm3/chat_template.jinja", None, None),
}


def msg(role, content, **rest):
    """A message as kiln/chat builds it: role, content, then the optional keys
    in this order (name, tool_calls, tool_call_id), present only when set."""
    m = {"role": role, "content": content}
    for key in ("name", "tool_calls", "tool_call_id"):
        if key in rest:
            m[key] = rest[key]
    return m


def tool_call(call_id, name, arguments):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city — «quoted» 'single' \"double\"",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
                "days": {"type": "integer", "minimum": 1, "maximum": 7.5, "nullable": True, "example": None},
            },
            "required": ["city"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {"name": "get_time", "description": "Current time", "parameters": {"type": "object", "properties": {}}},
}
TOOLS = [WEATHER_TOOL, TIME_TOOL]

UNICODE = "Ünïcödé “smart” 'single' \"double\" — 日本語 🚀\ttab\nnew line {{ not jinja }} {% raw %} \\ backslash </s>"

# name -> (messages, tools, extra, which templates: "all", "tools" = templates
# that mention tools, or a template-source substring that must be present)
CONVERSATIONS = {
    "system_user": ([msg("system", "You are a terse assistant."), msg("user", "What is the capital of France?")], None, None, "all"),
    "user_only": ([msg("user", "Hello!")], None, None, "all"),
    "multi_turn": ([msg("user", "Hi"), msg("assistant", "Hello! How can I help?"), msg("user", "Tell me a joke.")], None, None, "all"),
    "system_multi_turn": (
        [
            msg("system", "Be kind."),
            msg("user", "One?"),
            msg("assistant", "1"),
            msg("user", "Two?"),
            msg("assistant", "2"),
        ],
        None,
        None,
        "all",
    ),
    "unicode_quotes": (
        [msg("system", UNICODE), msg("user", "  " + UNICODE + "  \n"), msg("assistant", "  padded\n\n"), msg("user", "ok?")],
        None,
        None,
        "all",
    ),
    "assistant_thinking": (
        [msg("user", "Capital of France?"), msg("assistant", "<think>\nIt is Paris.\n</think>\n\nParis.")],
        None,
        None,
        "all",
    ),
    "system_no_think": ([msg("system", "Be brief. /no_think"), msg("user", "hi")], None, None, "all"),
    "bad_role_order": ([msg("user", "one"), msg("user", "two")], None, None, "all"),
    "tools": (
        [
            msg("system", "You can call tools."),
            msg("user", "Weather in Zürich?"),
            msg("assistant", "", tool_calls=[tool_call("call_1", "get_weather", {"city": "Zürich", "unit": "celsius", "days": 2})]),
            msg("tool", '{"temperature": 21.5, "sky": "clear"}', name="get_weather", tool_call_id="call_1"),
            msg("assistant", "It is 21.5 °C and clear."),
            msg("user", "And tomorrow?"),
        ],
        TOOLS,
        None,
        "tools",
    ),
    "tools_user_only": ([msg("user", "What time is it?")], TOOLS, None, "tools"),
    "enable_thinking_false": ([msg("user", "2+2?")], None, {"enable_thinking": False}, "enable_thinking"),
    "date_string": ([msg("user", "What day is it?")], [TIME_TOOL], {"date_string": "1 Jan 2025", "tools_in_user_message": False}, "date_string"),
}


# Small templates, one Jinja feature each, rendered with SNIPPET_VARS (plus
# raise_exception and strftime_now): where gonja and jinja2 could part ways.
SNIPPET_VARS = {
    "messages": CONVERSATIONS["tools"][0],
    "tools": TOOLS,
    "d": {"b": 1, "a": [1, 2.5, "x"], "c": {"z": None, "y": True}},
    "s": "  Hello, wörld! 'q' \"qq\"  ",
    "n": 7,
    "f": 2.5,
    "empty": [],
    "floats": [1.0, 0.1, 1e-05, 1.5e-07, 1e16, 1e15, 123456789.125, -0.0, 3.0e20, 2**53 + 1],
    "ctrl": "tab\there <b>&amp;</b> \u2028 \x01 \x7f \u00a0 \u200b é 🚀 \\ \"",
    "none_value": None,
}

SNIPPETS = [
    # conditional expressions inside parentheses and call arguments (gonja
    # parses them only as a whole output: kiln/chat rewrites them)
    "{{ 'x' + (s if n else 'none') + '|' + (s if empty else 'no') }}",
    "{% for m in messages %}{{ (m.role if loop.first else '-') ~ ',' }}{% endfor %}",
    "{{ [1, (2 if n else 3), ('a, b' if empty else '(c)')] | join('/') }}",
    "{% set v = ((s if empty else 'z') ~ '!') %}{{ v }}{{ ('a' if not n else ('b' if n else 'c')) }}",
    # whitespace control under trim_blocks + lstrip_blocks
    "  {% if true %}\n  yes\n  {% endif %}\nafter\n",
    "{% for m in messages %}\n{{ m.role }}\n{% endfor %}\n",
    "a  {%- if true %} b {% endif -%}  c",
    "a  {%+ if true %}b{% endif %}\n  c",
    "  {# comment #}\nx\n    {#- c2 -#}   y",
    "{{ 'a' }}\n{{ 'b' }}\n\n",
    "x\n  {%- set y = 1 %}\n  z {{ y }}\n",
    "{% raw %}{{ not rendered }}{% endraw %}\n",
    "line1\n    {% for i in [1, 2] %}\n    {{ i }}\n    {% endfor %}\nend",
    "\t{% if true %}tabbed{% endif %}\n",
    "{{- '  x  ' -}}\n\n{{ ' y ' }}",
    "a\n  {% if true %}\n  b\n  {% endif %}  \nc",
    "  {{ 'x' }}\n  {{ 'y' }}  \n",
    "x {% if true %}y{% endif %}\n z",
    "{% for i in [1, 2] -%}\n  {{ i }}\n{%- endfor %}\n",
    "a\r\n  {% if true %}\r\nb\r\n  {% endif %}\r\nc\r\n",
    "  {# c #} x\n  {#- d #}\ny",
    "{% set x = 1 %}\n\n{{ x }}\n{% set y = 2 -%}\n\n{{ y }}",
    "  {%- if true %}\n  a{% endif %}\n    {%+ if true %}b\n{% endif %}",
    "{% if false %}\nno\n{% elif true %}\nyes\n{% else %}\nno\n{% endif %}\n",
    "{% for m in messages %}\n    {%- if loop.first %}\n        first\n    {%- endif %}\n{% endfor %}",
    # loops
    "{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }}|{% endfor %}",
    "{% for i in [1, 2, 3] %}{{ loop.previtem }}-{{ loop.nextitem }}-{{ loop.cycle('a', 'b') }};{% endfor %}",
    "{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}",
    "{% for x in empty %}a{% else %}empty{% endfor %}",
    "{% for x in [1, 2, 3, 4] if x is even %}{{ x }}{% endfor %}",
    "{% for k in d %}{{ k }};{% endfor %}",
    "{% for k, v in d.items() %}{{ k }}={{ v | tojson }};{% endfor %}",
    "{% for k, v in d | items %}{{ k }}:{{ v | string }};{% endfor %}",
    "{% for m in messages[::-1] %}{{ m.role }},{% endfor %}",
    "{% for a, b in [[1, 2], [3, 4]] %}{{ a }}{{ b }}{% endfor %}",
    # scoping and namespace
    "{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}",
    "{% set ns = namespace(a=1, s='') %}{% for i in range(4) %}{% set ns.a = ns.a + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.a }} {{ ns.s }}",
    "{% if true %}{% set y = 5 %}{% endif %}{{ y }}",
    "{% set x %}block {{ n }}{% endset %}[{{ x }}]",
    "{% macro f(a, b='B') %}<{{ a }}{{ b }}>{% endmacro %}{{ f(1) }}{{ f(2, b='c') }}",
    "{% filter upper %}shout {{ n }}{% endfilter %}",
    # slicing and indexing
    "{{ messages[1:] | length }} {{ messages[-1].content }} {{ messages[0]['role'] }}",
    "{{ 'héllo'[1:3] }}|{{ 'héllo'[-1] }}|{{ 'héllo' | first }}|{{ 'héllo' | last }}|{{ 'hello'[1:3] }}|{{ 'hello'[-1] }}|{{ 'hello'[::-1] }}|{{ [1, 2, 3, 4][::2] | join(',') }}|{{ [1, 2, 3][:-1] | join(',') }}",
    # string methods
    "[{{ s.strip() }}][{{ s.lstrip() }}][{{ s.rstrip() }}][{{ 'xxaxx'.strip('x') }}][{{ '\n\nab\n'.lstrip('\n') }}]",
    "{{ s.split() | tojson }} {{ 'a,b,,c'.split(',') | tojson }} {{ 'a,b,c'.split(',', 1) | tojson }} {{ 'a b c'.rsplit(' ', 1) | tojson }}",
    "{{ 'a</think>b'.split('</think>')[0] }}|{{ 'a</think>b'.split('</think>')[-1] }}",
    "{{ s.startswith('  He') }} {{ s.endswith('x') }} {{ 'abc'.startswith(('x', 'a')) }}",
    "{{ \"hello world it's\".title() }}|{{ 'hELLO'.capitalize() }}|{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}|{{ 'aaa'.replace('a', 'b', 2) }}",
    "{{ '-'.join(['a', 'b']) }} {{ 'hello'.find('l') }} {{ 'hello'.count('l') }}",
    # tests
    "{{ n is defined }} {{ nope is defined }} {{ nope is undefined }} {{ none is none }} {{ n is none }}",
    "{{ s is string }} {{ n is string }} {{ d is mapping }} {{ messages is mapping }} {{ s is iterable }} {{ messages is iterable }} {{ n is iterable }}",
    "{{ n is number }} {{ f is number }} {{ n is integer }} {{ f is float }} {{ s is sequence }} {{ messages is sequence }}",
    "{{ false is false }} {{ none is false }} {{ 0 is false }} {{ true is true }} {{ 1 is true }}",
    "{{ 'ell' in s }} {{ 'b' in d }} {{ 'z' in d }} {{ 2 in [1, 2] }} {{ 'tool_calls' in messages[2] }} {{ 'tool_calls' in messages[1] }}",
    "{{ n is odd }} {{ n is even }} {{ n is divisibleby 7 }} {{ 'a' is lower }} {{ 'A' is upper }}",
    # filters
    "[{{ s | trim }}] {{ s | length }} {{ 'héllo' | length }} {{ messages | length }} {{ d | length }}",
    "{{ nope | default('dflt') }} {{ '' | default('dflt', true) }} {{ n | default(1) }}",
    "{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(' / ') }}",
    "{{ messages | rejectattr('role', 'equalto', 'user') | map(attribute='role') | list | tojson }}",
    "{{ messages | map(attribute='role') | unique | list | tojson }}",
    "{{ [3, 1, 2] | sort | join(',') }} {{ ['b', 'A', 'c'] | sort | join(',') }} {{ [1, 2, 3] | reverse | join(',') }}",
    "{{ [1, 2, 3] | first }} {{ [1, 2, 3] | last }} {{ [1, 2, 3] | sum }} {{ [1, 5, 3] | max }} {{ [4, 2, 3] | min }}",
    "{{ 'ab' | list | tojson }} {{ ['a', 'b'] | join }} {{ [1, 2] | join('-') }}",
    "{{ ['x', 'code_interpreter', 'y'] | reject('equalto', 'code_interpreter') | join(', ') }}",
    "{{ 'abc' | upper }} {{ 'ABC' | lower }} {{ 'hello world' | title }} {{ 'hello World' | capitalize }} {{ 'aXa' | replace('a', 'b') }}",
    "{{ '3' | int + 1 }} {{ '2.5' | float }} {{ 2.567 | round(2) }} {{ -3 | abs }} {{ 'one two  three' | wordcount }}",
    "{{ d | dictsort | tojson }}",
    "{{ 'a\nb' | indent(2) }}|{{ 'a\nb' | indent(2, true) }}",
    # tojson and str()
    "{{ d | tojson }}",
    "{{ d | tojson(indent=2) }}",
    "{{ d | tojson(indent=0) }}",
    "{{ d | tojson(sort_keys=true) }}",
    "{{ d | tojson(separators=(',', ':')) }}",
    "{{ ctrl | tojson }}",
    "{{ ctrl | tojson(ensure_ascii=true) }}",
    "{{ floats | tojson }}",
    "{{ floats | string }}",
    "{{ tools[0] | string }}",
    "{{ ctrl | string }}",
    "{{ [ctrl, \"it's\", 'say \"hi\"', \"both ' \\\" \"] | string }}",
    "{{ messages[2].tool_calls | tojson }}",
    "{{ {'k': 'v', 'n': none, 't': true} | tojson }} {{ [] | tojson }} {{ {} | tojson }} {{ none | tojson }}",
    "{{ 'x' | tojson }} {{ 1 | tojson }} {{ 1.0 | tojson }} {{ true | tojson }}",
    # printing values and operators
    "{{ true }} {{ false }} {{ 3 }} {{ 2.5 }} {{ 1.0 }} {{ 10 / 4 }} {{ 10 // 4 }} {{ 7 % 3 }} {{ -n }} {{ 2.0 ** 2 }}",
    "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 'ab' ~ 1 ~ 2.5 }} {{ 'a' + 'b' }} {{ 'ab' * 2 }}",
    "{{ 'yes' if n > 5 else 'no' }} {{ 'yes' if nope else 'no' }} {{ n > 5 and 'x' or 'y' }} {{ not none }} {{ not nope }} {{ not '' }}",
    "{{ 1 < 2 < 3 }} {{ 1 == 1.0 }} {{ 'a' != 'b' }} {{ [1, 2] == [1, 2] }}",
    "{{ nope }}|{{ d.nope }}|{{ d['nope'] }}|{{ messages[0].nope }}",
    "{{ d.b }} {{ d['a'][1] }} {{ d.c.y }} {{ d.get('b') }} {{ d.get('zz', 'dflt') }} {{ d.keys() | list | tojson }} {{ d.values() | list | length }}",
    "{{ none is none }} {{ none_value is none }} {{ none_value is not none }} {{ 'x' if none_value else 'y' }} {{ none_value | tojson }}",
    "{{ \"it's a-b (c) [d] {e} <f> g_h\" | title }}|{{ 'ßtraße ﬁne' | upper }}|{{ 'ßa' | capitalize }}|{{ 'ΣΑΣ ΟΔΟΣ' | lower }}|{{ 'İ' | lower | length }}",
    # known differences (see the package comment): jinja2 / gonja
    "{{ 2 ** 10 }}",
    "{{ 'ab' ~ none }}",
    "{{ none }}|{{ none_value }}",
    "{{ not n }}",
    "{{ none_value is defined }}",
    "{{ none_value | default('d') }}",
    "{{ nope is none }}",
    "{{ 'héllo'[1] }}",
    # transformers' globals
    "{{ strftime_now('%Y-%m-%d %H:%M:%S') }}|{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%B %d, %Y') }}|{{ strftime_now('%A %a %j %p %I %y %m %M %S %%') }}",
    "{{ strftime_now('%U %W %w %u %V %G %e %C %D %F %T %R') }}|{{ strftime_now('%c|%x|%X') }}|{{ strftime_now('%-d %-m %-H') }}",
    "before{{ raise_exception('Bad ' ~ n) }}after",
    "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools: ' + m.name) }}{% endif %}{% endfor %}",
    "{% generation %}gen {{ n }}{% endgeneration %}",
]


class GenerationTag(jinja2.ext.Extension):
    """transformers' AssistantTracker as far as rendering goes: {% generation %}
    ... {% endgeneration %} renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return NOW.strftime(fmt)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def token_text(tok):
    """A special token from tokenizer_config.json: a string or an AddedToken dict."""
    if isinstance(tok, dict):
        return tok.get("content")
    return tok


def load(shared, rel, bos, eos):
    path = os.path.join(shared, "tokenizers", rel)
    if "#" in rel:  # entry N of a JSON list of {"template", "name"}
        file, entry = rel.split("#")
        with open(os.path.join(shared, "tokenizers", file), encoding="utf-8") as f:
            return json.load(f)[int(entry)]["template"], bos, eos
    if rel.endswith("tokenizer_config.json"):
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
        source = cfg["chat_template"]
        if isinstance(source, list):
            source = next(t["template"] for t in source if t["name"] == "default")
    else:
        with open(path, encoding="utf-8") as f:
            source = f.read()
        cfg_path = os.path.join(os.path.dirname(path), "tokenizer_config.json")
        cfg = {}
        if bos is None and eos is None and os.path.exists(cfg_path):
            with open(cfg_path, encoding="utf-8") as f:
                cfg = json.load(f)
    if bos is None and eos is None:
        bos, eos = token_text(cfg.get("bos_token")), token_text(cfg.get("eos_token"))
    return source, bos, eos


def render(template, messages, tools, extra, agp, bos, eos, snippet=False):
    if snippet:
        try:
            return {"output": template.render(**SNIPPET_VARS)}
        except jinja2.exceptions.TemplateError as e:
            raised = type(e) is jinja2.exceptions.TemplateError
            return {"error": str(e) if raised else f"{type(e).__name__}: {e}", "raised": raised}
        except Exception as e:  # noqa: BLE001
            return {"error": f"{type(e).__name__}: {e}", "raised": False}
    kwargs = {}
    if bos is not None:
        kwargs["bos_token"] = bos
    if eos is not None:
        kwargs["eos_token"] = eos
    kwargs.update(extra or {})
    try:
        out = template.render(messages=messages, tools=tools, documents=None, add_generation_prompt=agp, **kwargs)
        return {"output": out}
    except jinja2.exceptions.TemplateError as e:
        # raise_exception raises exactly TemplateError; jinja2's own errors are subclasses.
        raised = type(e) is jinja2.exceptions.TemplateError
        return {"error": str(e) if raised else f"{type(e).__name__}: {e}", "raised": raised}
    except Exception as e:  # noqa: BLE001 -- any failure is a fixture fact
        return {"error": f"{type(e).__name__}: {e}", "raised": False}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", default=os.path.join(os.path.dirname(root), "shared"))
    ap.add_argument("--out", default=os.path.join(root, "testdata", "chat", "expected.json"))
    args = ap.parse_args()

    env = environment()
    result = {
        "generator": "tools/chat-fixtures/make_fixtures.py",
        "jinja2": jinja2.__version__,
        "python": sys.version.split()[0],
        "now": NOW.isoformat(),
        "templates": {},
    }
    for name, (rel, bos, eos) in TEMPLATES.items():
        source, bos, eos = load(args.shared, rel, bos, eos)
        template = env.from_string(source)
        cases = []
        for conv, (messages, tools, extra, which) in CONVERSATIONS.items():
            if which == "tools" and "tools" not in source:
                continue
            if which not in ("all", "tools") and which not in source:
                continue
            for agp in (False, True):
                case = {"name": conv, "messages": messages, "add_generation_prompt": agp}
                if tools is not None:
                    case["tools"] = tools
                if extra:
                    case["extra"] = extra
                case.update(render(template, messages, tools, extra, agp, bos, eos))
                cases.append(case)
        entry = {"path": "tokenizers/" + rel}
        if bos is not None:
            entry["bos_token"] = bos
        if eos is not None:
            entry["eos_token"] = eos
        entry["cases"] = cases
        result["templates"][name] = entry
        errors = sum("error" in c for c in cases)
        print(f"{name}: {len(cases)} cases, {errors} raise", file=sys.stderr)

    result["snippet_vars"] = SNIPPET_VARS
    result["snippets"] = []
    for text in SNIPPETS:
        entry = {"template": text}
        try:
            entry.update(render(env.from_string(text), None, None, None, None, None, None, snippet=True))
        except jinja2.exceptions.TemplateSyntaxError as e:
            entry.update({"error": f"TemplateSyntaxError: {e}", "raised": False})
        result["snippets"].append(entry)
    print(f"snippets: {len(SNIPPETS)}, {sum('error' in s for s in result['snippets'])} fail", file=sys.stderr)

    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
