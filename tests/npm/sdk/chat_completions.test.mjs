// chat_completions.test.mjs: /v1/chat/completions through the official openai client.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { openai, MODEL } from './common.mjs';

test('non-streaming reply parses', async () => {
  const r = await openai.chat.completions.create({
    model: MODEL, messages: [{ role: 'user', content: 'Hello' }], max_tokens: 8, seed: 1,
  });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices.length, 1);
  assert.ok(['stop', 'length', 'tool_calls'].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 0);
});

test('stream parses and matches the non-streaming text', async () => {
  const body = { model: MODEL, messages: [{ role: 'user', content: 'Hi there' }], max_tokens: 8, temperature: 0 };
  const whole = await openai.chat.completions.create(body);
  const stream = await openai.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
  let text = '', reasoning = '', usage = null;
  for await (const ch of stream) {
    if (ch.usage) usage = ch.usage;
    for (const c of ch.choices) {
      text += c.delta?.content ?? '';
      reasoning += c.delta?.reasoning_content ?? '';
    }
  }
  assert.equal(text, whole.choices[0].message.content ?? '');
  assert.ok(usage && usage.completion_tokens > 0);
});

test('a wrong key is a 401 AuthenticationError', async () => {
  const { default: OpenAI } = await import('openai');
  const bad = new OpenAI({ baseURL: openai.baseURL, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(bad.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
});

test('cancellation: an aborted stream frees its slot and the server answers the next request', async () => {
  const stream = await openai.chat.completions.create({
    model: MODEL, messages: [{ role: 'user', content: 'Tell me everything' }], max_tokens: 400, stream: true,
  });
  let n = 0;
  for await (const ch of stream) if (ch.choices[0]?.delta?.content || ch.choices[0]?.delta?.reasoning_content) if (++n === 2) break;
  assert.equal(n, 2); // leaving the loop aborts the request
  const r = await openai.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'x' }], max_tokens: 2 });
  assert.equal(r.object, 'chat.completion');
  const health = await fetch(`${openai.baseURL.replace(/\/v1$/, '')}/health`).then((x) => x.json());
  assert.equal(health.status, 'ok');
});

test('errors are the SDK error classes: a bad field is a 400 BadRequestError naming it', async () => {
  const { default: OpenAI } = await import('openai');
  await assert.rejects(openai.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'x' }], temperature: 'hot' }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && /temperature/.test(e.message));
});
