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
