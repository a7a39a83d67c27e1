#!/usr/bin/python3
"""Renders the chat templates in tests/data/chat_templates/ with jinja2 configured exactly as
transformers' apply_chat_template does (_compile_jinja_template), and writes the contexts and the
expected outputs to tests/data/chat_templates/expected_<name>.json for kiln_template_test.

Run with Debian's python3-jinja2:  /usr/bin/python3 tools/chat_templates/generate_expected.py
"""
import json
import os
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data", "chat_templates")


def make_env():
    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather <now> & 'later' in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Zürich"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 10.5}},
        "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web.\nReturns snippets.",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"},
                                                     "safe": {"type": "boolean", "default": True},
                                                     "extra": {"type": "null"}},
                   "required": ["q"]}}}


def call(name, args, as_string):
    return {"id": "call_" + name, "type": "function",
            "function": {"name": name,
                         "arguments": json.dumps(args, ensure_ascii=False) if as_string else args}}


def u(t):
    return {"role": "user", "content": t}


def a(t):
    return {"role": "assistant", "content": t}


def s(t):
    return {"role": "system", "content": t}


def tool(t):
    return {"role": "tool", "content": t}


PLAIN = [
    ("single_user", [u("Hello!")]),
    ("system_user", [s("You are a helpful assistant."), u("Hi there")]),
    ("multi_turn", [u("What is 2+2?"), a("4"), u("And 3+3?"), a("6"), u("Thanks")]),
    ("system_multi_turn", [s("Be terse."), u("Name a colour."), a("Blue."), u("Another?")]),
    ("unicode", [u("Grüße aus München 🇩🇪 — 你好，世界！ Привет"), a("¡Hola! 😀 ∑∫√"),
                 u("日本語もOK？")]),
    ("whitespace", [s("  leading and trailing spaces  \n"), u("\n\n  tabs\tand\nnewlines  \n"),
                    a("\t answer with trailing newline\n"), u("   ")]),
    ("empty_content", [u(""), a(""), u("x")]),
    ("special_chars", [u("Quotes ' \" and backslash \\ and {{ braces }} {% tags %} <b>html</b> & amp"),
                       a("Sure: `code` $x$ #hash"), u("ok")]),
    ("long_conversation", [m for i in range(8) for m in (u("question %d" % i), a("answer %d" % i))]
     + [u("last question")]),
    ("assistant_last", [u("Tell me a joke"), a("Why did the chicken cross the road?")]),
    ("system_only_then_user", [s(""), u("empty system prompt")]),
    ("crlf_content", [u("line1\r\nline2\r\n"), a("ok\r\n"), u("end")]),
    ("control_chars", [u("bell\x07 nul-free \x1b[0m esc"), a("fine"), u("\u2028 separator")]),
    ("json_looking", [u('{"a": [1, 2, {"b": null}]}'), a("[]"), u("{}")]),
    ("markdown", [s("# Title\n\n- item 1\n- item 2"), u("```python\nprint('hi')\n```"),
                  a("Looks fine."), u("> quote")]),
    ("very_long_message", [u("lorem ipsum " * 200)]),
    ("trailing_spaces_roles", [u("q "), a(" a"), u(" q2 "), a("a2  "), u("q3")]),
    ("emoji_only", [u("🙂🙃"), a("👍"), u("🎉")]),
    ("think_tags_in_user", [u("<think>not reasoning</think> just text"), a("ok"), u("again")]),
    ("tool_response_text_in_user", [u("<tool_response>\nfake\n</tool_response>"), a("hm"),
                                    u("real")]),
]

THINKING = [
    ("think_in_history", [u("Solve x+1=3"), a("<think>\nx = 3-1\n</think>\n\nx = 2"), u("Now x+2=5")]),
    ("think_last", [u("Why is the sky blue?"),
                    a("<think>Rayleigh scattering.</think>\n\nBecause of Rayleigh scattering.")]),
    ("reasoning_content", [u("Pick a number"),
                           {"role": "assistant", "content": "7",
                            "reasoning_content": "\nAny number works; 7 is popular.\n"}]),
    ("reasoning_content_none", [u("hey"), {"role": "assistant", "content": "hello",
                                           "reasoning_content": None}, u("bye")]),
]


def tool_convs(as_string):
    suf = "_strargs" if as_string else "_dictargs"
    return [
        ("tool_defs" + suf, [s("You can use tools."), u("Weather in Paris?")], [WEATHER, SEARCH]),
        ("tool_defs_nosys" + suf, [u("Weather in Paris?")], [WEATHER]),
        ("tool_call" + suf, [u("Weather in Paris?"),
                             {"role": "assistant", "content": "",
                              "tool_calls": [call("get_weather", {"city": "Paris", "days": 2},
                                                  as_string)]},
                             tool('{"temp_c": 18, "sky": "cloudy"}')], [WEATHER]),
        ("tool_call_content" + suf, [s("sys"), u("Search cats and weather in Zürich"),
                                     {"role": "assistant", "content": "Let me check.",
                                      "tool_calls": [call("search", {"q": "cats"}, as_string),
                                                     call("get_weather",
                                                          {"city": "Zürich", "unit": "celsius"},
                                                          as_string)]},
                                     tool("cats are great"), tool("12 degrees"),
                                     a("Cats are great and it is 12°C."), u("thanks")],
         [WEATHER, SEARCH]),
    ]


def deepseek_tool_convs():
    # DeepSeek V3's template concatenates arguments as strings and expects content None.
    return [
        ("tool_call_one", [u("Weather in Paris?"),
                           {"role": "assistant", "content": None,
                            "tool_calls": [call("get_weather", {"city": "Paris"}, True)]},
                           tool('{"temp_c": 18}')]),
        ("tool_call_one_answer", [s("sys prompt"), u("Weather in Paris?"),
                                  {"role": "assistant", "content": None,
                                   "tool_calls": [call("get_weather", {"city": "Paris"}, True)]},
                                  tool('{"temp_c": 18}'), a("It is 18°C."), u("thanks")]),
        ("tool_call_two", [u("Cats and weather"),
                           {"role": "assistant", "content": None,
                            "tool_calls": [call("search", {"q": "cats"}, True),
                                           call("get_weather", {"city": "Oslo"}, True)]},
                           tool("cats!"), tool("cold")]),
        ("two_systems", [s("first"), s("second"), u("hi")]),
    ]


def gemma_convs():
    return [
        ("content_parts", [{"role": "system", "content": [{"type": "text", "text": "Sys in parts"}]},
                           {"role": "user", "content": [{"type": "image"},
                                                        {"type": "text", "text": "  Describe  "}]},
                           {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]},
                           u("More?")]),
    ]


def cases_for(name):
    convs = [(n, m, None) for n, m in PLAIN]
    if name == "qwen3":
        convs += [(n, m, None) for n, m in THINKING]
        convs += tool_convs(False) + tool_convs(True)
    elif name == "deepseek_v3":
        convs += [(n, m, None) for n, m in deepseek_tool_convs()]
    elif name == "gemma3":
        convs += [(n, m, None) for n, m in gemma_convs()]
        convs += [("not_alternating", [u("a"), u("b")], None)]
    elif name == "llama3_1":
        convs += [(n, m, None) for n, m in THINKING[:2]]
    out = []
    for cname, messages, tools in convs:
        for agp in (False, True):
            variants = [{}]
            if name == "qwen3":
                variants = [{}, {"enable_thinking": True}, {"enable_thinking": False}]
            for extra in variants:
                ctx = {"messages": messages, "add_generation_prompt": agp}
                if tools is not None:
                    ctx["tools"] = tools
                ctx.update(extra)
                suffix = "_agp" if agp else ""
                suffix += "".join("_%s_%s" % (k, str(v).lower()) for k, v in extra.items())
                out.append((cname + suffix, ctx))
    return out


TOKENS = {
    "qwen3": {"eos_token": "<|im_end|>"},
    "llama3_1": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "deepseek_v3": {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
    "gemma3": {"bos_token": "<bos>", "eos_token": "<end_of_turn>"},
}


def main():
    env = make_env()
    for name in ("qwen3", "llama3_1", "deepseek_v3", "gemma3"):
        with open(os.path.join(DATA, name + ".jinja"), encoding="utf-8") as f:
            source = f.read()
        tmpl = env.from_string(source)
        cases = []
        for cname, ctx in cases_for(name):
            ctx = dict(ctx, **TOKENS[name])
            case = {"name": cname, "context": ctx}
            try:
                case["expected"] = tmpl.render(**ctx)
            except TemplateError as e:
                case["error"] = str(e)
            cases.append(case)
        path = os.path.join(DATA, "expected_%s.json" % name)
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"template": name + ".jinja", "jinja2_version": jinja2.__version__,
                       "cases": cases}, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print("%s: %d cases (%d errors)" % (path, len(cases),
                                             sum(1 for c in cases if "error" in c)))


if __name__ == "__main__":
    main()


# Small templates, one language feature each: expected_features.json. Each entry is
# (template, context); the expected output (or error message) comes from jinja2.
FEATURES = [
    ("{{ 'a' }}{# comment #}{{ \"b\" }}", {}),
    ("{{ 'esc: \\n\\t\\\\ \\' \\\" \\u00e9 \\x41' }}", {}),
    ("{{ 1 + 2 * 3 - 4 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }}", {}),
    ("{{ 1.5 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e-5 }} {{ 3.0 }} {{ 10 / 4 }} {{ 2 ** -1 }}", {}),
    ("{{ true }} {{ false }} {{ none }} {{ True }} {{ None }}", {}),
    ("{{ [1, 'a', true, none, 1.5, [2], {'k': 'v'}] }} {{ (1, 2) }} {{ (1,) }} {{ {'a': \"it's\"} }}", {}),
    ("{{ 'a' ~ 1 ~ none ~ true ~ undefined_var }}", {}),
    ("{{ 'ab' * 3 }} {{ [1] * 2 }} {{ [1] + [2] }} {{ 'x' + 'y' }}", {}),
    ("{{ 1 == 1.0 }} {{ 1 != 2 }} {{ 'a' < 'b' }} {{ 2 >= 3 }} {{ [1, 2] == [1, 2] }} {{ 1 == true }}", {}),
    ("{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }}", {}),
    ("{{ 1 and 'x' }} {{ 0 or 'y' }} {{ not 0 }} {{ none or [] }} {{ '' and 1 }}", {}),
    ("{{ 'yes' if x else 'no' }} {{ 'yes' if not x else 'no' }} [{{ 'only' if x }}]", {"x": 0}),
    ("{% if a %}A{% elif b %}B{% else %}C{% endif %}", {"a": 0, "b": 1}),
    ("{% for x in [1, 2, 3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
     "{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}", {}),
    ("{% for x in [1, 2, 3] %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %}", {}),
    ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}",
     {"d": {"z": 1, "a": 2}}),
    ("{% for x in range(10) if x is odd %}{{ x }}{{ loop.length }},{% endfor %}", {}),
    ("{% for x in [] %}x{% else %}empty{% endfor %}", {}),
    ("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}"
     "{% endif %}{{ x }}{% endfor %}", {}),
    ("{% for x in 'héllo' %}{{ x }}|{% endfor %}", {}),
    ("{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}", {}),
    ("{% for x in [1, 2] %}{% for y in [3, 4] %}{{ x }}{{ y }}{{ loop.index }} {% endfor %}{{ loop.index }}{% endfor %}", {}),
    ("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}", {}),
    ("{% set ns = namespace(n=0, s='') %}{% for i in range(4) %}{% set ns.n = ns.n + i %}"
     "{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }} {{ ns.s }}", {}),
    ("{% set x %}block {{ 1 + 1 }}{% endset %}[{{ x }}]", {}),
    ("{% set a, b = 1, 2 %}{{ a }}{{ b }}", {}),
    ("{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}"
     "{{ greet('Ann') }} {{ greet('Bob', 'Hi') }} {{ greet(greeting='Yo', name='Cy') }}", {}),
    ("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(5) }}", {}),
    ("{% macro g() %}{{ top }}{% endmacro %}{% set top = 'T' %}{{ g() }}", {}),
    ("{{ s[1:3] }}{{ s[::-1] }}{{ s[-2:] }}{{ s[:2] }}{{ l[1:] }}{{ l[::2] }}{{ l[-1] }}{{ s[0] }}",
     {"s": "héllo", "l": [1, 2, 3, 4]}),
    ("{{ d.a }} {{ d['a'] }} {{ d.b.c }} {{ l[0].x }} [{{ d.missing }}] {{ d.missing is defined }}",
     {"d": {"a": 1, "b": {"c": 2}}, "l": [{"x": 3}]}),
    ("{{ '  hi  ' | trim }}|{{ 'xxhixx' | trim('x') }}|{{ [1, 2] | length }}|{{ 'héllo' | length }}"
     "|{{ {'a': 1} | count }}", {}),
    ("{{ 'Hello World' | upper }} {{ 'Hello' | lower }} {{ 'hELLO wORLD' | capitalize }} "
     "{{ 'hello big-world (x)' | title }}", {}),
    ("{{ 'a-b-c' | replace('-', '+') }} {{ 'aaa' | replace('a', 'b', 2) }} {{ [1, 2, 3] | join(', ') }}"
     " {{ ['a', 'b'] | join }}", {}),
    ("{{ x | default('d') }} {{ '' | default('d') }} {{ '' | default('d', true) }} {{ none | d('n') }}"
     " {{ 0 | d('z', boolean=true) }}", {}),
    ("{{ [3, 1, 2] | first }} {{ [3, 1, 2] | last }} {{ 'abc' | list }} {{ 12 | string }} "
     "{{ '42' | int }} {{ '3.5' | float }} {{ 'x' | int }} {{ -3 | abs }} {{ 3.7 | int }}", {}),
    ("{{ 2.5 | round }} {{ 3.14159 | round(2) }} {{ 2.1 | round(0, 'ceil') }} {{ 2.9 | round(method='floor') }}", {}),
    ("{{ [1, 2, 1, 3] | unique | list }} {{ [1, 2, 3] | reverse | list }} {{ 'abc' | reverse }} "
     "{{ [3, 1, 2] | sort }} {{ ['b', 'A', 'c'] | sort }} {{ [3, 1, 2] | sort(reverse=true) }}", {}),
    ("{{ users | selectattr('active') | map(attribute='name') | join(',') }} "
     "{{ users | rejectattr('active') | map(attribute='name') | list }} "
     "{{ users | selectattr('age', 'gt', 30) | map(attribute='name') | list }} "
     "{{ users | sort(attribute='age') | map(attribute='name') | join }} "
     "{{ users | selectattr('name', 'equalto', 'bo') | list | length }}",
     {"users": [{"name": "al", "active": True, "age": 40}, {"name": "bo", "active": False, "age": 20},
                {"name": "cy", "active": True, "age": 31}]}),
    ("{{ [1, 2, 3, 4] | select('even') | list }} {{ [1, 2, 3, 4] | reject('odd') | list }} "
     "{{ ['a', 'b'] | map('upper') | list }} {{ [0, 1, ''] | select | list }}", {}),
    ("{{ x | tojson }} {{ x | tojson(indent=2) }} {{ 'é<>&\\'\"\\n' | tojson }} {{ [] | tojson }} "
     "{{ {} | tojson(indent=2) }} {{ [1.0, 2.5e-7, none, true] | tojson }} {{ x | tojson(sort_keys=true) }}",
     {"x": {"b": [1, {"c": None}], "a": "s"}}),
    ("{{ '<a href=\"x\">&</a>' | e }} {{ '<b>' | escape }} {{ '<i>' | safe }}", {}),
    ("{{ 'one two  three' | wordcount }} [{{ 'a\\nb\\n\\nc' | indent }}] [{{ 'a\\nb' | indent(2, true) }}]"
     " [{{ 'a\\n\\nb' | indent(2, blank=true) }}]", {}),
    ("{{ d | items | list }} {{ d.keys() | list }} {{ d.values() | list }} {{ d.get('a') }} "
     "{{ d.get('zz', 'dflt') }} {{ d.get('zz') }}", {"d": {"a": 1, "b": 2}}),
    ("{{ [1, 2, 3, 4, 5] | batch(2) | list }} {{ [1, 2, 3] | batch(2, 0) | list }}", {}),
    ("{{ [3, 1, 2] | max }} {{ [3, 1, 2] | min }} {{ [1, 2, 3] | sum }}", {}),
    ("{{ 1 is odd }} {{ 2 is even }} {{ 6 is divisibleby 3 }} {{ 6 is divisibleby(4) }} "
     "{{ x is defined }} {{ y is undefined }} {{ none is none }} {{ 'a' is string }} "
     "{{ 1 is number }} {{ 1 is integer }} {{ 1.0 is float }} {{ true is boolean }} "
     "{{ {} is mapping }} {{ [] is iterable }} {{ 'a' is sequence }} {{ true is true }} "
     "{{ 0 is false }} {{ 1 is eq 1 }} {{ 1 is ne 2 }} {{ 2 is in [1, 2] }} {{ 'ab' is lower }} "
     "{{ 'AB' is upper }} {{ range is callable }} {{ x is not none }} {{ 1 is integer and 2 is even }}",
     {"x": 1}),
    ("{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'xxaxx'.strip('x') }}|"
     "{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}{{ 'abc'.startswith(('x', 'y')) }}",
     {"s": "  pad  "}),
    ("{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a,b,c'.split(',', 1) }} "
     "{{ 'hello world'.title() }} {{ 'HeLLo'.lower() }} {{ 'hi'.upper() }} {{ 'hi there'.capitalize() }}",
     {}),
    ("{{ 'aXbXc'.replace('X', '-') }} {{ 'hello'.find('l') }} {{ 'hello'.find('z') }} "
     "{{ 'hello'.count('l') }} {{ '-'.join(['a', 'b']) }} {{ 'héllo'.find('l') }}", {}),
    ("{{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ range(5, 0, -2) | list }} "
     "{{ dict(a=1, b='x') }} {{ namespace(a=1).a }}", {}),
    ("  {% if true %}\n    x\n  {% endif %}\n  y {{ 'v' }}  \n{# c #}\nz\n", {}),
    ("a  {%- if true -%}  b  {%- endif -%}  c {{- ' d ' -}} e\n\n{{ 'f' }}", {}),
    ("{%+ if true %}  keep{% endif %}\n", {}),
    ("<{% for i in [1, 2] %}\n  {{ i }}\n{% endfor %}>\n", {}),
    ("line\n    {# comment #}\n  text {% if 1 %}\n{% endif %}end\n\n", {}),
    ("{{ messages[0]['content'] }}{{ messages | length }}{{ messages[-1].role }}",
     {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}),
    ("{{ raise_exception('bad input: ' ~ 42) }}", {}),
    ("{% if x is string %}s{% elif x is mapping %}m{% elif x is iterable %}i{% endif %}",
     {"x": [1]}),
    ("{{ x }} {{ x.y is defined }} {% for m in x %}{{ m }}{% endfor %}[{{ x | length }}]", {}),
    ("{{ 'x' if undefined_thing else 'y' }} {{ (undefined_thing or 'z') }}", {}),
    ("{% set l = [1, 2] %}{% set l2 = l + [3] %}{{ l }}{{ l2 }}{{ l | length }}", {}),
    ("{{ {'a': [1, 2], 'b': {'c': 'd'}}['b']['c'] }} {{ ({'a': 1}).a }} {{ [[1, 2], [3]][0][1] }}", {}),
    ("{{ '%s' }} {{ 'x' ~ 'y' | upper }} {{ -2 | abs }} {{ not true == false }}", {}),
    ("{{ 'a' < 'b' < 'c' }} {{ 1 < 2 > 0 }}", {}),
    ("{{ 3 - 1 - 1 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 10 - 2 * 3 }} {{ (1 + 2) * 3 }}", {}),
    ("{{ 0.5 | string }} {{ 100000000000000000.0 }} {{ 123456789.125 }} {{ 1/3 }} {{ -0.0 }}", {}),
    ("{% for x in {'b': 1, 'a': 2} | dictsort %}{{ x }}{% endfor %}", {}),
    ("{% if true %}{% set top = 'set in if' %}{% endif %}{{ top }}", {}),
    ("{% macro m(items) %}{% for i in items %}<{{ i }}>{% endfor %}{% endmacro %}{{ m([1, 2]) }}"
     "{{ m(items=['a']) }}", {}),
    ("{{ 'a' 'b' }} {{ \"x\" ~ 'y' }} {{ 1_000 }} {{ 0.5e1 }}", {}),
    ("{% for m in messages if m.role != 'system' %}{{ loop.index }}:{{ m.content }} {% endfor %}",
     {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                   {"role": "assistant", "content": "a"}]}),
    ("{{ tools | map(attribute='function') | map(attribute='name') | join(', ') }}",
     {"tools": [{"function": {"name": "a"}}, {"function": {"name": "b"}}]}),
    ("{{ x.content is none }} {{ x['content'] is not none }} {{ x.get('content', 'd') }}",
     {"x": {"content": None}}),
    ("{{ 'é😀\\n\"' | tojson(ensure_ascii=true) }} {{ {'k': [1, 2]} | tojson(separators=(',', ':')) }}"
     " {{ {'k': 'v'} | tojson(indent=4) }}", {}),
    ("{{ x | tojson }}", {"x": {"int": 12345678901234, "neg": -3, "f": 0.1, "big": 1e300, "small": 5e-324,
                               "e": 1.5e16, "list": [], "nested": {"a": {}}}}),
    ("{% for i in range(3) %}{{ loop.cycle('a', 'b') }}{% endfor %}", {}),
    ("{{ 'abc'[5] }}|{{ [1][3] }}|{{ {'a': 1}['b'] }}|{{ 'abc'[-1] }}", {}),
    ("{{ 7 / 0 }}", {}),
    ("{{ none.attr }}", {}),
    ("{{ [1, 2] | join(attribute='x') }}", {}),
    ("{% set x = [3, 1] | sort %}{{ x }}{{ x | sum }}{{ (x | first) + 1 }}", {}),
    ("{{ ' '.join(['a', 'b']) }} {{ 'a b c'.split(' ', 1) }} {{ 'Hello'.startswith('He') and 'x' }}", {}),
    ("{%- for m in messages -%}\n  {%- if m.role == 'user' -%}\n    U:{{ m.content | trim }}\n  {%- else -%}\n"
     "    A:{{ m.content }}\n  {%- endif -%}\n{%- endfor -%}",
     {"messages": [{"role": "user", "content": "  hi  "}, {"role": "assistant", "content": "yo"}]}),
    ("{% set content = 'outer' %}{% for i in [1, 2] %}{{ content }}{% set content = i %}{{ content }}{% endfor %}{{ content }}", {}),
]


def whitespace_cases():
    """Whitespace control around each kind of tag: text before/after x modifiers."""
    texts = ["", " ", "a  \n", "\n", "\t \n  ", "x ", "\n\n  "]
    out = []
    for before in texts:
        for after in texts:
            for lm in ("", "-", "+"):
                for rm in ("", "-", "+"):
                    out.append(("A%s{%%%s if true %s%%}%sB%s{%%%s endif %s%%}%sC" %
                                (before, lm, rm, after, before, lm, rm, after), {}))
                    out.append(("A%s{#%s c %s#}%sB" % (before, lm, rm, after), {}))
                    out.append(("A%s{{%s 'v' %s}}%sB" % (before, lm, rm, after), {}))
    return out


def feature_cases():
    env = make_env()
    cases = []
    for i, (src, ctx) in enumerate(FEATURES + whitespace_cases()):
        case = {"name": "feature_%02d" % i, "template": src, "context": ctx}
        try:
            case["expected"] = env.from_string(src).render(**ctx)
        except TemplateError as e:
            case["error"] = str(e)
            # raise_exception raises a plain TemplateError: its message must match exactly.
            case["raised"] = type(e) is TemplateError
        except Exception as e:  # noqa: BLE001 - a Python error: our render must fail too
            case["error"] = "%s: %s" % (type(e).__name__, e)
            case["python_error"] = True
        cases.append(case)
    path = os.path.join(DATA, "expected_features.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"jinja2_version": jinja2.__version__, "cases": cases}, f, ensure_ascii=False,
                  indent=1)
        f.write("\n")
    print("%s: %d cases" % (path, len(cases)))


feature_cases()
