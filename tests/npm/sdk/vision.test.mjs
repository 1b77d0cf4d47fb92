// vision.test.mjs: images through the official clients (tests/e2e/serve_vision.c runs it against
// `serve -m tinyvl.gguf --mmproj mmproj-tinyvl-f32.gguf`; DSF_IMAGE = a PNG file). The openai
// client sends an image_url content part (chat) and an input_image part (Responses), the
// @anthropic-ai/sdk client an image block with a base64 source; each must be answered and parse.
// tinyvl has random weights: the checks are shapes, usage counting the image's tokens (a prompt
// longer than its text alone), stream == non-stream at temperature 0, and the SDKs' own error
// types for a remote URL (400).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { openai, anthropic, MODEL } from './common.mjs';

const IMAGE = process.env.DSF_IMAGE;
if (!IMAGE) throw new Error('DSF_IMAGE must be set (tests/e2e/serve_vision.c sets it)');
const b64 = readFileSync(IMAGE).toString('base64');
const dataUrl = `data:image/png;base64,${b64}`;
const Q = 'What is in this picture?';

test('openai chat: image_url part', async () => {
  const withImage = await openai.chat.completions.create({
    model: MODEL, max_tokens: 4, temperature: 0,
    messages: [{ role: 'user', content: [{ type: 'text', text: Q }, { type: 'image_url', image_url: { url: dataUrl } }] }],
  });
  const textOnly = await openai.chat.completions.create({
    model: MODEL, max_tokens: 4, temperature: 0, messages: [{ role: 'user', content: Q }],
  });
  assert.equal(withImage.object, 'chat.completion');
  assert.equal(typeof withImage.choices[0].message.content, 'string');
  // the span replaces one placeholder: at least START, one IMAGE row, NEWLINE, END more
  assert.ok(withImage.usage.prompt_tokens >= textOnly.usage.prompt_tokens + 4,
    `prompt_tokens ${withImage.usage.prompt_tokens} vs text only ${textOnly.usage.prompt_tokens}`);
  const stream = await openai.chat.completions.create({
    model: MODEL, max_tokens: 4, temperature: 0, stream: true, stream_options: { include_usage: true },
    messages: [{ role: 'user', content: [{ type: 'text', text: Q }, { type: 'image_url', image_url: { url: dataUrl } }] }],
  });
  let text = '', usage = null;
  for await (const ch of stream) {
    if (ch.usage) usage = ch.usage;
    for (const c of ch.choices) text += (c.delta.content ?? '');
  }
  assert.equal(text, withImage.choices[0].message.content ?? '');
  assert.equal(usage.prompt_tokens, withImage.usage.prompt_tokens);
});

test('openai chat: a remote URL is a 400 BadRequestError', async () => {
  await assert.rejects(openai.chat.completions.create({
    model: MODEL, max_tokens: 2,
    messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'https://example.com/a.png' } }] }],
  }), (e) => e instanceof OpenAI.BadRequestError && /remote image URLs are not fetched/.test(e.message));
});

test('openai responses: input_image part', async () => {
  const r = await openai.responses.create({
    model: MODEL, max_output_tokens: 4, temperature: 0,
    input: [{ role: 'user', content: [{ type: 'input_text', text: Q }, { type: 'input_image', image_url: dataUrl, detail: 'auto' }] }],
  });
  assert.equal(r.object, 'response');
  assert.ok(r.usage.input_tokens > 10, `input_tokens ${r.usage.input_tokens}`);
});

test('anthropic messages: image block with a base64 source', async () => {
  const m = await anthropic.messages.create({
    model: MODEL, max_tokens: 4, temperature: 0,
    messages: [{ role: 'user', content: [
      { type: 'image', source: { type: 'base64', media_type: 'image/png', data: b64 } },
      { type: 'text', text: Q }] }],
  });
  assert.equal(m.type, 'message');
  assert.ok(m.usage.input_tokens + (m.usage.cache_read_input_tokens ?? 0) > 10);
  const s = anthropic.messages.stream({
    model: MODEL, max_tokens: 4, temperature: 0,
    messages: [{ role: 'user', content: [
      { type: 'image', source: { type: 'base64', media_type: 'image/png', data: b64 } },
      { type: 'text', text: Q }] }],
  });
  const fin = await s.finalMessage();
  assert.deepEqual(fin.content.map((b) => b.type), m.content.map((b) => b.type));
  await assert.rejects(anthropic.messages.create({
    model: MODEL, max_tokens: 2,
    messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'url', url: 'https://example.com/a.png' } }] }],
  }), (e) => e instanceof Anthropic.BadRequestError && /remote image URLs/.test(e.message));
});
