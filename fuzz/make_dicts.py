#!/usr/bin/env python3
"""Writes fuzz/dicts/<target>.dict: per target, tokens of its input format and the short string
literals of the parser's sources (the keys, type names and keywords it compares input against),
which libFuzzer splices into inputs. Rerun after a parser learns new names."""
import glob
import os
import re

os.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

def lits(files):
    out = []
    for f in files:
        s = open(f, encoding='utf-8').read()
        for m in re.finditer(r'(?<![A-Za-z0-9_R])"((?:[^"\\\n]|\\.)*)"', s):
            v = m.group(1)
            if 1 <= len(v) <= 28 and ' ' not in v and '%' not in v and not v.startswith('#') and '/' not in v and ':' not in v[:-1]:
                try:
                    v = bytes(v, 'utf-8').decode('unicode_escape').encode('latin-1')
                except Exception:
                    continue
                out.append(v)
    return out
def enc(b):
    r = ''
    for c in b:
        if c in (0x22, 0x5c): r += '\\' + chr(c)
        elif 0x20 <= c < 0x7f: r += chr(c)
        else: r += '\\x%02X' % c
    return '"' + r + '"'
def write(name, files, extra, quote_json_keys=True):
    items = []
    seen = set()
    for v in [e.encode() if isinstance(e, str) else e for e in extra] + lits(files):
        cands = [v]
        if quote_json_keys and re.fullmatch(rb'[A-Za-z_][A-Za-z0-9_.]*', v):
            cands.append(b'"' + v + b'"')
        for c in cands:
            if c not in seen:
                seen.add(c); items.append(c)
    with open(f'fuzz/dicts/{name}.dict', 'w') as f:
        f.write(f'# libFuzzer dictionary for kiln_fuzz_{name}, written by fuzz/make_dicts.py: tokens of the\n# format, then the short string literals of the parser\'s sources (keys, type names, keywords).\n')
        for v in items: f.write(enc(v) + '\n')
    print(name, len(items))
JSON = ['{', '}', '[', ']', ':', ',', 'true', 'false', 'null', '1e308', '-1', '0', '4294967296', '9223372036854775807', '18446744073709551616', '1.5', '\\u0000', '\\ud800', '""']
write('safetensors', ['loaders/safetensors.cc', 'loaders/loader_util.cc', 'kernels/dtype.cc'], JSON + ['__metadata__', 'dtype', 'shape', 'data_offsets', 'F32', 'F16', 'BF16', 'F64', 'I64', 'I32', 'U8', 'BOOL', 'F8_E4M3'])
write('safetensors_sharded', ['loaders/safetensors.cc', 'loaders/loader_util.cc', 'loaders/model_root.cc'], JSON + ['weight_map', 'metadata', 'total_size', 'model.safetensors', 'model-00001-of-00002.safetensors', 'model-00002-of-00002.safetensors', '../', '/etc/passwd', '\n--kiln-shard--\n', '__metadata__', 'dtype', 'shape', 'data_offsets', 'F32', 'BF16', 'F16'])
write('tensorizer', ['loaders/tensorizer_format.cc', 'loaders/tensorizer_checkpoint.cc'], [b'|TZR|', b'\x01\x00\x00\x00', b'\x02\x00\x00\x00', b'\x03\x00\x00\x00', b'\x04\x00\x00\x00', b'\xff\xff\xff\xff\xff\xff\xff\xff', b'\x00\x00\x00\x00\x00\x00\x00\x80', b'<V2\x00torch.bfloat16', b'|V1\x00torch.float8_e4m3fn', b'<f4', b'<f2', b'<i8', b'|b1', b'\x1e', '.vllm_tensorized_marker', '.kiln_tensorized_marker'], quote_json_keys=False)
write('model_config', ['models/model_config.cc'], JSON)
write('tokenizer_json', glob.glob('tokenizer/*.cc'), JSON + ['\n--kiln-file--\n', 'Ġ', '▁', '<0x0A>', '<|endoftext|>'])
write('chat_template', glob.glob('template/*.cc'), ['{{', '}}', '{%', '%}', '{#', '#}', '{%-', '-%}', '{{-', '-}}', 'endfor', 'endif', 'endmacro', 'endset', 'endcall', 'endfilter', 'elif', 'else', 'loop.index0', 'loop.last', 'namespace(', 'messages', 'message.role', "message['content']", 'tools', 'add_generation_prompt', 'tool_calls', '|tojson', '|length', '|trim', '\n--kiln-context--\n', '[::-1]', '**'], quote_json_keys=False)
write('openai_request', ['server/openai_request.cc'], JSON + ['user', 'assistant', 'system', 'tool', 'function', 'text', 'image_url'])
