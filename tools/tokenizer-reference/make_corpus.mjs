// Writes tests/data/tokenizers/corpus.json: the strings every tokenizer conformance test encodes.
//
//   node make_corpus.mjs            (from tools/tokenizer-reference; needs no npm packages)
//
// The output is deterministic (no clock, no Math.random: a fixed-seed PRNG where variety is
// wanted), so re-running it leaves the file unchanged unless this script changed.
//
// Every string must be valid UTF-8 once written (no lone surrogates): the C++ tokenizer refuses
// invalid UTF-8, so it cannot be compared here. Two characters are deliberately left out because
// the JavaScript references' regexes disagree with Hugging Face tokenizers (Oniguruma) on them:
// U+0085 (NEL: whitespace for Oniguruma/PCRE2, not for JS `\s`) and U+FEFF (BOM: JS `\s`
// matches it, Oniguruma/PCRE2 do not). See tests/data/tokenizers/README.md.
import { writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, "..", "..", "tests", "data", "tokenizers", "corpus.json");

// mulberry32: a tiny deterministic PRNG.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const entries = [];
const counters = new Map();
function add(category, ...texts) {
  for (const text of texts) {
    const n = (counters.get(category) ?? 0) + 1;
    counters.set(category, n);
    entries.push({ name: `${category}/${String(n).padStart(3, "0")}`, category, text });
  }
}

// ---------------------------------------------------------------------------------------------
// Tiny inputs: empty string, single characters of every kind.
add("single", "", " ", "a", "A", "z", "0", "9", ".", ",", "!", "?", "'", '"', "-", "_", "@", "#",
  "$", "%", "&", "*", "(", ")", "<", ">", "|", "\\", "/", "~", "`", "^", "{", "}", "[", "]",
  "\n", "\t", "\r", "\r\n", "é", "ß", "ñ", "Ω", "я", "中", "あ", "ア", "한", "ع", "א", "क", "ก",
  "😀", "🇺", "€", "©", "½", "²", "\u00a0", "\u3000", "\u0301", "\u200d", "▁", "Ġ", "Ċ");

// ---------------------------------------------------------------------------------------------
// English prose.
add("prose",
  "Hello world",
  "Hello, world!",
  "hello world",
  "HELLO WORLD",
  "The quick brown fox jumps over the lazy dog.",
  "The quick brown fox jumps over the lazy dog. The five boxing wizards jump quickly.",
  "It was the best of times, it was the worst of times, it was the age of wisdom, it was the " +
    "age of foolishness, it was the epoch of belief, it was the epoch of incredulity.",
  "Call me Ishmael. Some years ago—never mind how long precisely—having little or no money in " +
    "my purse, and nothing particular to interest me on shore, I thought I would sail about a " +
    "little and see the watery part of the world.",
  "In the beginning God created the heaven and the earth.",
  "To be, or not to be: that is the question.",
  "Q: What is the capital of France?\nA: Paris.",
  "Dear Sir or Madam,\n\nI am writing to inquire about the position advertised on your " +
    "website.\n\nYours faithfully,\nJane Doe",
  "Machine learning models, such as large language models (LLMs), are trained on vast amounts " +
    "of text data; they learn statistical patterns rather than \"facts\".",
  "She said, “I’ll be there at 5 o’clock.” He replied: ‘Fine.’",
  "Wait... what?! No way!!!",
  "e.g. i.e. etc. vs. Mr. Mrs. Dr. St. a.m. p.m. U.S.A.",
  "The price is $19.99 (tax not included) — a 20% discount!",
  "Semicolons; colons: dashes – and em-dashes — all appear here.",
  "This sentence ends with a space. ",
  " This sentence starts with a space.",
  "  Two leading spaces and two trailing spaces.  ",
  "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt " +
    "ut labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation " +
    "ullamco laboris nisi ut aliquip ex ea commodo consequat.",
  "A\nB\nC",
  "First paragraph.\n\nSecond paragraph.\n\n\nThird paragraph after two blank lines.",
  "Bullet list:\n- one\n- two\n- three\n",
  "Numbered list:\n1. alpha\n2. beta\n3. gamma",
  "# Heading\n\nSome *emphasis*, some **bold**, and `inline code`.\n\n> A quote.\n",
  "| col1 | col2 |\n|------|------|\n| a    | b    |",
  "The year 1969 saw the first Moon landing; Apollo 11 launched on July 16.",
  "antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
  "user@example.com https://example.com/path?query=1&b=2#frag",
  "@alice mentioned #hashtags and $TICKER in a tweet.",
  "The temperature was -3°C (26.6°F) at 06:45.",
  "It's a truth universally acknowledged, that a single man in possession of a good fortune, " +
    "must be in want of a wife.",
  "CamelCaseIdentifier snake_case_identifier kebab-case-identifier SCREAMING_SNAKE",
  "iPhone iPad macOS YouTube LaTeX",
  "Hello\tworld\twith\ttabs",
  "word word  word   word    word",
  "Mixed CASE wOrDs ArE HeRe",
  "What's up? Not much. You?",
  "End of text without newline",
  "End of text with newline\n",
  "End of text with two newlines\n\n",
);

// ---------------------------------------------------------------------------------------------
// Contractions and apostrophes in various cases (GPT-2's regex is case-sensitive, Qwen's is not).
add("contraction",
  "DON'T", "don't", "Don't", "DoN't", "it's", "It's", "IT'S", "It'S", "iT's",
  "we're", "WE'RE", "We'Re", "they've", "THEY'VE", "I'm", "I'M", "i'm", "you'll", "YOU'LL",
  "You'Ll", "he'd", "HE'D", "she'd've", "can't", "CAN'T", "won't", "y'all", "ma'am",
  "rock 'n' roll", "the '90s", "students' books", "O'Neil O'NEIL o'neil", "'s", "'S", "'t",
  "'re", "'ll", "'d", "'", "''", "'''", "'hello'", "it’s (curly apostrophe)", "DON’T",
  "I'd've thought it'd've been", "that's what she's said it's", "x's y't z're",
  " 's", "'s'", "a's b'S c'T", "Let's go! LET'S GO!",
);

// ---------------------------------------------------------------------------------------------
// Code.
add("code_python",
  "def add(a, b):\n    return a + b\n",
  "import numpy as np\nimport torch\n\nx = np.arange(10)\nprint(x.sum())\n",
  "class Foo(object):\n    def __init__(self, value: int = 0) -> None:\n        self.value = value\n\n" +
    "    def __repr__(self):\n        return f\"Foo({self.value!r})\"\n",
  "for i in range(10):\n\tif i % 2 == 0:\n\t\tprint(i)\n",
  "if __name__ == \"__main__\":\n    main()\n",
  "x = [i**2 for i in range(100) if i % 3 != 0]",
  "with open('file.txt', 'r', encoding='utf-8') as f:\n    data = f.read()",
  "lambda x: x * 2  # comment with trailing spaces   \n",
  "@decorator\nasync def fetch(url: str) -> dict:\n    async with session.get(url) as r:\n" +
    "        return await r.json()\n",
  "try:\n    pass\nexcept (ValueError, KeyError) as e:\n    raise RuntimeError(str(e)) from e\n",
  "    indented = True\n        more_indented = False\n",
  "\"\"\"Docstring with 'quotes' and \\\"escapes\\\".\"\"\"",
  "print('Hello, world!')",
  "a = {'key': [1, 2, 3], 'other': None, 'flag': True}",
  "x += 1; y -= 2; z *= 3; w //= 4; v **= 5",
);
add("code_cpp",
  "#include <iostream>\n\nint main() {\n  std::cout << \"Hello, world!\" << std::endl;\n" +
    "  return 0;\n}\n",
  "template <typename T>\nT max(T a, T b) { return a > b ? a : b; }",
  "std::vector<std::unique_ptr<Foo>> foos;\nfoos.emplace_back(std::make_unique<Foo>(42));",
  "for (int i = 0; i < n; ++i) {\n    sum += a[i] * b[i];\n}",
  "absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text) const;",
  "#define MAX(a, b) ((a) > (b) ? (a) : (b))",
  "// C++ comment\n/* block\n * comment */\nint x = 0x7fffffff; // 2147483647",
  "namespace kiln {\nnamespace {\n\nconstexpr int kSize = 1 << 20;\n\n}  // namespace\n}  // namespace kiln",
  "auto lambda = [&](const auto& x) -> bool { return x != nullptr && *x >= 0; };",
  "if (p->next && p->next->value == 3) { p = p->next; } else if (!p) { return; }",
  "struct alignas(64) Foo { uint8_t bytes[64]; };\nstatic_assert(sizeof(Foo) == 64);",
  "std::string s = R\"(raw string with \"quotes\" and \\backslashes)\";",
);
add("code_json",
  "{}",
  "[]",
  "{\"key\": \"value\"}",
  "{\"name\":\"kiln\",\"version\":\"1.0.0\",\"tags\":[\"llm\",\"inference\"],\"stars\":1234}",
  "{\n  \"model\": \"qwen3\",\n  \"temperature\": 0.7,\n  \"max_tokens\": 512,\n" +
    "  \"stop\": [\"\\n\\n\", \"</s>\"]\n}",
  "[{\"id\":1},{\"id\":2},{\"id\":3}]",
  "{\"a\":{\"b\":{\"c\":{\"d\":[1,2,[3,4,[5]]]}}}}",
  "{\"unicode\": \"\\u00e9\\u4e2d\", \"escaped\": \"line\\nbreak\\ttab\"}",
  "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi!\"},{\"role\":\"assistant\",\"content\":\"Hello!\"}]}",
  "\"},{\"",
  ",,,,,,,,",
  "\",\"\",\"\",\"",
);
add("code_shell",
  "ls -la /tmp && cd ~ && pwd",
  "#!/usr/bin/env bash\nset -euo pipefail\n\nfor f in *.txt; do\n  echo \"$f\"\ndone\n",
  "grep -rn 'TODO' src/ | wc -l",
  "export PATH=\"$HOME/.local/bin:$PATH\"",
  "cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build build -j$(nproc)",
  "curl -sSL https://example.com/install.sh | sh -s -- --yes",
  "find . -name '*.cc' -exec clang-format -i {} +",
  "echo $((1 + 2)) > out.txt 2>&1",
  "tar -xzf archive.tar.gz -C /opt/ && chmod +x /opt/bin/*",
  "git log --oneline --graph --decorate | head -n 20",
);
add("code_other",
  "<!DOCTYPE html>\n<html>\n<head><title>Test</title></head>\n<body><p class=\"x\">Hi</p></body>\n</html>",
  "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC LIMIT 10;",
  "^[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\\.[a-zA-Z]{2,}$",
  "fn main() {\n    let v: Vec<u32> = (0..10).collect();\n    println!(\"{:?}\", v);\n}",
  "func main() {\n\tfmt.Println(\"hello\")\n}",
  "const f = async (x) => { await g(x ?? 0); return x?.y ?? null; };",
  "\\begin{equation}\n  E = mc^2\n\\end{equation}",
  "key: value\nlist:\n  - a\n  - b\nnested:\n  inner: 1\n",
  "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n-old\n+new\n",
  "C:\\Windows\\System32\\drivers\\etc\\hosts",
);

// ---------------------------------------------------------------------------------------------
// Numbers and digit runs.
add("number", "0", "00", "000", "1", "12", "123", "1234", "12345", "123456", "1234567",
  "12345678", "123456789", "1234567890", "9876543210123456789", "3.14159", "3.14159265358979323846",
  "0.5", ".5", "5.", "-42", "+42", "1e10", "6.022e23", "1,000", "1,000,000", "1.000.000,00",
  "10 000 000", "0x1F", "0xDEADBEEF", "0b1010", "0o755", "2024-01-15", "2024-01-15T12:30:45Z",
  "12:30:45", "$1,234.56", "€ 99,99", "50%", "100%!", "1st 2nd 3rd 4th", "+1 (555) 123-4567",
  "192.168.0.1", "v1.2.3", "3/4", "1/2 + 1/3 = 5/6", "x1 y22 z333", "abc123def456", "a1b2c3",
  "2^10 = 1024", "1234 5678 9012 3456", "007", "٠١٢٣٤٥٦٧٨٩", "१२३", "１２３４５", "²³¹", "½ ¼ ¾",
  "Ⅰ Ⅱ Ⅲ Ⅻ", "①②③", "一二三", "〇", "3.0.0-rc.1+build.5", "$100", "100 000 km/h");
add("digit_run", "1".repeat(20), "0123456789".repeat(5), "9".repeat(100), "31415926535897932384" +
  "62643383279502884197169399375105820974944592307816406286208998628034825342117067982148086513282",
  ...(() => {
    const r = rng(7);
    const runs = [];
    for (const len of [17, 33, 64, 128, 300]) {
      let s = "";
      for (let i = 0; i < len; ++i) s += String(Math.floor(r() * 10));
      runs.push(s);
    }
    return runs;
  })(),
  "1 22 333 4444 55555 666666 7777777 88888888 999999999");

// ---------------------------------------------------------------------------------------------
// Whitespace: spaces, tabs, newlines, CRLF, blank lines, trailing spaces.
add("whitespace", "  ", "   ", "    ", " ".repeat(8), " ".repeat(17), "\t\t", "\t\t\t\t", " \t ",
  "\n\n", "\n\n\n", "\n\n\n\n\n\n", "\r\n\r\n", "\r\r", " \n", "\n ", " \n ", "\n \n", "\t\n",
  "\n\t", " \r\n ", "a b", "a  b", "a   b", "a    b", "a\tb", "a\t\tb", "a \tb", "a\t b", "a\nb",
  "a\n\nb", "a\n\n\nb", "a\r\nb", "a\r\n\r\nb", "a\rb", "a \nb", "a  \n  b", "a\n  b", "  a",
  "a  ", "  a  ", "\ta", "a\t", "\na", "a\n", "line one  \nline two\t\nline three \r\nend",
  "trailing spaces   \n\n   leading spaces", "x\u00a0y", "x\u00a0\u00a0y", "x\u3000y",
  "\u3000\u3000全角", "x\u2003y", "x\u2009y", "x\u202fy", "\u000b", "a\u000bb", "\u000c",
  "a\u000cb", "word \n\n word", "   \n   \n   ", "\n\n\nText after blank lines",
  "Text before blank lines\n\n\n", "  \t  \t  mixed  \t  \n", "a" + " ".repeat(30) + "b");

// ---------------------------------------------------------------------------------------------
// Scripts other than Latin.
add("chinese",
  "你好", "你好，世界！", "中华人民共和国", "我爱自然语言处理。",
  "今天天气很好，我们去公园散步吧。",
  "人工智能（AI）是计算机科学的一个分支，它企图了解智能的实质，并生产出一种新的能以人类智能相似的方式做出反应的智能机器。",
  "《红楼梦》是中国古典四大名著之一。", "一二三四五六七八九十百千万亿", "繁體中文與简体中文",
  "“引号”和‘单引号’以及「直角引号」", "价格：¥1,299.00元", "第1章 第２章 第三章",
);
add("japanese",
  "こんにちは", "こんにちは、世界！", "カタカナ", "ｶﾀｶﾅ（半角）", "東京都渋谷区",
  "私は日本語を勉強しています。", "吾輩は猫である。名前はまだ無い。",
  "ラーメン🍜が大好き！", "令和６年１２月３１日", "ＡＢＣ全角英字とｱｲｳ半角カナ",
);
add("korean",
  "안녕하세요", "안녕하세요, 세계!", "한국어 자연어 처리", "대한민국의 수도는 서울입니다.",
  "ㄱㄴㄷㄹ ㅏㅑㅓㅕ", "김치찌개를 먹고 싶어요 😋",
);
add("arabic",
  "مرحبا بالعالم", "السلام عليكم ورحمة الله وبركاته", "اللغة العربية جميلة.",
  "العدد ١٢٣ والعدد 456", "كِتَابٌ مُشَكَّلٌ", "Mixed: العربية and English",
);
add("hebrew", "שלום עולם", "עברית היא שפה שמית.", "בְּרֵאשִׁית בָּרָא");
add("hindi",
  "नमस्ते दुनिया", "हिन्दी भारत की राजभाषा है।", "क्षत्रिय श्री ज्ञान", "मैं ठीक हूँ, धन्यवाद!",
  "संस्कृतम् ॐ",
);
add("russian",
  "Привет, мир!", "Съешь же ещё этих мягких французских булок, да выпей чаю.",
  "МОСКВА москва Москва", "Ёлка и ёжик", "Россия — большая страна.",
);
add("greek",
  "Γειά σου κόσμε", "Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλικο σκύλο.",
  "αβγδεζηθικλμνξοπρστυφχψω", "ΑΒΓΔΕΖΗΘΙΚΛΜΝΞΟΠΡΣΤΥΦΧΨΩ", "ς σ Σ ΐ ΰ",
);
add("other_script",
  "สวัสดีครับ", "ภาษาไทยไม่มีช่องว่างระหว่างคำ", "Tiếng Việt có dấu: Việt Nam, Hà Nội, Đà Nẵng",
  "გამარჯობა", "Բարեւ Ձեզ", "ሰላም ልዑል", "வணக்கம்", "নমস্কার", "Здраво свете (Serbian)",
  "Ṭhis hås ẅeird lâtin lëtters", "Ağaç İstanbul ıi İI", "Straße STRASSE ẞ",
  "Ꭰ ᏣᎳᎩ (Cherokee)", "ᐊᐃᐅ (Inuktitut)", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕄𝕒𝕥𝕙 𝐁𝐨𝐥𝐝",
);

// ---------------------------------------------------------------------------------------------
// Emoji: single, ZWJ sequences, skin tones, flags, keycaps, variation selectors.
add("emoji",
  "😀", "😀😀😀", "Hello 😀 world", "👍", "👍🏻", "👍🏽", "👍🏿", "👋🏼 hi",
  "👨‍👩‍👧‍👦", "👩‍💻", "🧑🏽‍🚀", "👨🏾‍🤝‍👨🏻", "🏳️‍🌈", "🏴‍☠️", "❤️", "❤", "♥️", "☺️",
  "🇺🇸", "🇯🇵🇰🇷🇨🇳", "🇩🇪 Germany 🇫🇷 France", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "1️⃣2️⃣3️⃣", "#️⃣",
  "🎉🎊🥳", "🤖 AI", "🔥🔥🔥 fire", "emoji at end 🚀", "🚀emoji at start", "a😀b😀c",
  "🙂🙃", "🫠🫡🫶", "✅ ❌ ⚠️", "⭐️⭐⭐",
);

// ---------------------------------------------------------------------------------------------
// Combining marks; decomposed vs precomposed (Qwen3 applies NFC, Mistral and GPT-2 do not).
add("combining",
  "e\u0301", "\u00e9", "cafe\u0301", "caf\u00e9", "cafe\u0301 and caf\u00e9",
  "n\u0303", "man\u0303ana", "A\u030a", "\u212b (Angstrom sign)", "\u2126 (Ohm sign)",
  "\u1100\u1161\u11a8 (conjoining jamo)", "a\u0323\u0302", "a\u0302\u0323", "\u1ead",
  "o\u0308\u0304", "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e" +
    "\u0349\u035a\u032f\u031e\u0320\u034dA\u036b\u0357\u0334\u0362\u0335\u031c\u0330\u0354L",
  "\ufb01 ligature fi", "Vie\u0302\u0323t Nam (decomposed)", "\u0915\u093f",
  "e\u0301e\u0301e\u0301e\u0301", "\u0301 leading combining mark", "x\u20d7 vector",
  "\u00c5ngstr\u00f6m \u0041\u030angstro\u0308m",
);

// ---------------------------------------------------------------------------------------------
// Special tokens embedded in text, and near misses.
add("special",
  "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<unk>",
  "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
  "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n" +
    "What is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n4<|im_end|>",
  "text<|endoftext|>more text", "<|endoftext|><|endoftext|>", " <|endoftext|> ",
  "Document one.<|endoftext|>Document two.", "<|endoftext|>\n\nAfter", "<s>Hello</s>",
  "<s> Hello </s>", "<s><s></s></s>", "Hello</s>", "</s>Hello", "<s>\n", "a<unk>b",
  "<think>reasoning</think>", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
  "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>", "<|vision_start|><|image_pad|><|vision_end|>",
);
add("special_near_miss",
  "<|im_start", "im_start|>", "<|im_start |>", "<| im_start|>", "<|IM_START|>", "<<|im_start|>>",
  "<|im_start|<|im_end|>", "<|im_start|><|im_end|>", "|<|im_start|>|", "<|endoftext", "endoftext|>",
  "<|endoftext|", "<|end_of_text|>", "<|endoftext|>>", "<s", "s>", "< s >", "<ss>", "<s >",
  "</s", "</ s>", "<S>", "<unk", "<|>", "<||>", "<|", "|>",
);

// ---------------------------------------------------------------------------------------------
// Very long inputs.
const url = (() => {
  const r = rng(2024);
  const chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  let s = "https://www.example.com/very/long/path/to/a/resource/index.html?";
  let i = 0;
  while (s.length < 2048) {
    let v = "";
    const len = 3 + Math.floor(r() * 20);
    for (let k = 0; k < len; ++k) v += chars[Math.floor(r() * chars.length)];
    s += `${i ? "&" : ""}param${i}=${v}`;
    ++i;
  }
  return s.slice(0, 2048);
})();
const base64 = (() => {
  const r = rng(99);
  const chars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  let s = "";
  for (let i = 0; i < 1024; ++i) s += chars[Math.floor(r() * chars.length)];
  return s + "==";
})();
add("long",
  "a".repeat(500), " " + "z".repeat(500), "A".repeat(500), url, base64,
  "ab".repeat(500), "!".repeat(300), "😀".repeat(200), " ".repeat(1000), "\n".repeat(200),
  "中".repeat(300), "supercalifragilisticexpialidocious".repeat(20),
  "0123456789abcdef".repeat(64), "la ".repeat(400),
  "The quick brown fox jumps over the lazy dog. ".repeat(40),
  "-".repeat(80) + "\n" + "=".repeat(80), "\t".repeat(100), "é".repeat(300),
  "e\u0301".repeat(200),
);

// ---------------------------------------------------------------------------------------------
// Mixed scripts.
add("mixed",
  "Hello世界", "東京Tokyo2024", "Привет world", "abcабвαβγ", "日本語とEnglishの混在テキスト",
  "我用Python写了一个script来处理JSON数据。", "ID: 用户123, 名前: 山田太郎, 이름: 김철수",
  "مرحبا Hello שלום नमस्ते 你好 こんにちは 안녕하세요", "naïve café résumé façade coöperate",
  "C++和Rust都是系统编程语言🚀", "Ünïcödé ẞtraße 𝓜𝓪𝓽𝓱", "α=0.5, β=2, γ→∞",
  "価格は¥1,000です (about $7)", "The word 'привет' means 'hello'.",
  "snake_case_变量 = 42  # 注释", "E = mc² ∑∫√∞ ≠ ≤ ≥ ± × ÷",
);
add("symbols",
  "...", "…", "!!!", "???", "?!", "—", "–", "«guillemets»", "“curly double”", "‘curly single’",
  "©®™", "€£¥₹₩₽", "→←↑↓⇒⇔", "∀x∈ℝ: x²≥0", "<html>&amp;&lt;&gt;</html>", "~!@#$%^&*()_+",
  "`~`", "\\n\\t\\r", "***bold***", "___", "-->", "<!-- comment -->", "::", "::=", "=>", "->",
  "§ ¶ † ‡ •", "░▒▓█", "┌─┐│└┘", "♠♣♥♦", "♩♪♫♬",
);

// ---------------------------------------------------------------------------------------------
// A few deterministic random mixes of the material above, to exercise boundaries between
// categories (space before CJK, digits after emoji, newlines after special tokens...).
{
  const pool = entries.filter((e) => e.category !== "long" && e.text.length > 0 && e.text.length < 200)
    .map((e) => e.text);
  const seps = ["", " ", "\n", "  ", "\t", "\r\n", "\n\n"];
  const r = rng(31337);
  const mixes = [];
  for (let i = 0; i < 30; ++i) {
    const parts = 2 + Math.floor(r() * 4);
    let s = "";
    for (let k = 0; k < parts; ++k) {
      if (k) s += seps[Math.floor(r() * seps.length)];
      s += pool[Math.floor(r() * pool.length)];
    }
    mixes.push(s);
  }
  add("random_mix", ...mixes);
}

// ---------------------------------------------------------------------------------------------
// Checks: valid UTF-16 (so valid UTF-8 when written), no excluded characters, unique names.
const seen = new Set();
for (const e of entries) {
  if (!e.text.isWellFormed()) throw new Error(`${e.name}: lone surrogate`);
  if (/[\u0085\ufeff]/u.test(e.text)) throw new Error(`${e.name}: U+0085/U+FEFF excluded`);
  if (seen.has(e.name)) throw new Error(`duplicate name ${e.name}`);
  seen.add(e.name);
}

const doc = {
  description: "Strings encoded by tests/tokenizer/conformance_test.cc with every reference " +
    "tokenizer. Generated by tools/tokenizer-reference/make_corpus.mjs; do not edit by hand.",
  count: entries.length,
  strings: entries,
};
writeFileSync(out, JSON.stringify(doc, null, 1) + "\n");
const cats = [...counters.entries()].map(([k, v]) => `${k}:${v}`).join(" ");
console.log(`wrote ${out}: ${entries.length} strings (${cats})`);
