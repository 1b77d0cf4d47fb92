// messages.test.mjs: POST /v1/messages and /v1/messages/count_tokens (Anthropic Messages)
// through the official @anthropic-ai/sdk client. tiny41 has random weights: the checks are
// shapes (resources/messages/messages.d.ts), the SDK's own parsing and stream accumulation,
// and consistency between replies (stream == non-stream at temperature 0, usage arithmetic,
// count_tokens == input_tokens + cache_read_input_tokens), never specific text.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import Ajv from 'ajv';
import { anthropic, BASE, KEY, MODEL } from './common.mjs';

const STOP_REASONS = ['end_turn', 'max_tokens', 'stop_sequence', 'tool_use', 'model_context_window_exceeded'];

const weather = {
  name: 'get_weather',
  description: 'Current weather of a city',
  input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
};

// JSON schema of a Message as messages.d.ts types it (every non-optional field required,
// nullable ones may be null), checked by ajv, independently of the assertions below.
const nullable = (t) => ({ type: [t, 'null'] });
const block = (props) => ({ type: 'object', required: Object.keys(props), properties: props });
const validateMessage = new Ajv({ strict: false }).compile({
  type: 'object',
  required: ['id', 'container', 'content', 'diagnostics', 'model', 'role', 'stop_details', 'stop_reason',
    'stop_sequence', 'type', 'usage'],
  properties: {
    id: { type: 'string' }, type: { const: 'message' }, role: { const: 'assistant' }, model: { type: 'string' },
    stop_reason: { enum: [...['end_turn', 'max_tokens', 'stop_sequence', 'tool_use', 'pause_turn', 'refusal',
      'model_context_window_exceeded'], null] },
    stop_sequence: nullable('string'),
    content: {
      type: 'array',
      items: { oneOf: [
        block({ type: { const: 'text' }, text: { type: 'string' }, citations: nullable('array') }),
        block({ type: { const: 'thinking' }, thinking: { type: 'string' }, signature: { type: 'string' } }),
        block({ type: { const: 'tool_use' }, id: { type: 'string' }, name: { type: 'string' }, input: { type: 'object' },
          caller: block({ type: { const: 'direct' } }) }),
      ] },
    },
    usage: block({
      input_tokens: { type: 'integer' }, output_tokens: { type: 'integer' },
      cache_creation_input_tokens: nullable('integer'), cache_read_input_tokens: nullable('integer'),
      cache_creation: nullable('object'), inference_geo: nullable('string'), output_tokens_details: nullable('object'),
      server_tool_use: nullable('object'), service_tier: { enum: ['standard', 'priority', 'batch', null] },
      speed: { enum: ['standard', 'fast', null] },
    }),
  },
});

// The Message shape of messages.d.ts, and the usage arithmetic.
function checkMessage(m) {
  assert.ok(validateMessage(m), JSON.stringify(validateMessage.errors));
  assert.match(m.id, /^msg_[A-Za-z0-9]{24}$/);
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.equal(typeof m.model, 'string');
  assert.ok(Array.isArray(m.content));
  assert.ok(STOP_REASONS.includes(m.stop_reason), `stop_reason ${m.stop_reason}`);
  assert.ok(m.stop_sequence === null || typeof m.stop_sequence === 'string');
  assert.ok(Number.isInteger(m.usage.input_tokens) && m.usage.input_tokens >= 1);
  assert.ok(Number.isInteger(m.usage.output_tokens) && m.usage.output_tokens >= 1);
  assert.ok(Number.isInteger(m.usage.cache_read_input_tokens) && m.usage.cache_read_input_tokens >= 0);
  assert.equal(m.usage.cache_creation_input_tokens, 0);
  const kinds = m.content.map((b) => b.type);
  for (const b of m.content) {
    if (b.type === 'text') assert.equal(typeof b.text, 'string');
    else if (b.type === 'thinking') assert.ok(typeof b.thinking === 'string' && typeof b.signature === 'string');
    else if (b.type === 'tool_use') {
      assert.match(b.id, /^toolu_[A-Za-z0-9]{24}$/);
      assert.equal(typeof b.name, 'string');
      assert.ok(b.input && typeof b.input === 'object' && !Array.isArray(b.input));
    } else assert.fail(`unexpected block type ${b.type}`);
  }
  // order: thinking first, tool_use last
  if (kinds.includes('thinking')) assert.equal(kinds[0], 'thinking');
  const firstTool = kinds.indexOf('tool_use');
  if (firstTool >= 0) assert.ok(kinds.slice(firstTool).every((k) => k === 'tool_use'));
  assert.equal(m.stop_reason === 'tool_use', firstTool >= 0, 'stop_reason tool_use iff tool_use blocks');
}

// Content compared across two replies: equal except for tool_use ids, which are random per
// reply (checkMessage checks their form).
function sameContent(a, b) {
  const strip = (c) => c.map((x) => (x.type === 'tool_use' ? { ...x, id: 'toolu_' } : x));
  assert.deepEqual(strip(a), strip(b));
}

const prompt = (n) => n.usage.input_tokens + n.usage.cache_read_input_tokens;
const body = (extra = {}) => ({
  model: MODEL, max_tokens: 12, temperature: 0, messages: [{ role: 'user', content: 'Hello there' }], ...extra,
});

test('non-streaming reply parses, and count_tokens equals its prompt', async () => {
  const b = body({ system: 'You are terse.', metadata: { user_id: 'u-1' }, top_p: 0.9, top_k: 40 });
  const m = await anthropic.messages.create(b);
  checkMessage(m);
  const { max_tokens, temperature, top_p, top_k, metadata, ...countBody } = b;
  const c = await anthropic.messages.countTokens(countBody);
  assert.deepEqual(Object.keys(c), ['input_tokens']);
  assert.equal(c.input_tokens, prompt(m));
  // a follow-up with the same prompt reuses it: cached tokens are reported, the sum stays
  const again = await anthropic.messages.create(b);
  assert.equal(prompt(again), c.input_tokens);
});

test('stream: messages.stream().finalMessage() equals the non-streaming reply', async () => {
  const b = body({ system: [{ type: 'text', text: 'Be brief.' }, { type: 'text', text: 'Really.' }] });
  const whole = await anthropic.messages.create(b);
  const stream = anthropic.messages.stream(b);
  let text = '';
  stream.on('text', (d) => { text += d; });
  const fin = await stream.finalMessage();
  checkMessage(fin);
  sameContent(fin.content, whole.content);
  assert.equal(fin.stop_reason, whole.stop_reason);
  assert.equal(fin.usage.output_tokens, whole.usage.output_tokens);
  assert.equal(prompt(fin), prompt(whole));
  assert.equal(text, whole.content.filter((x) => x.type === 'text').map((x) => x.text).join(''));
});

// Reads the raw SSE of a streaming request: [{event, data}].
async function rawEvents(b) {
  const r = await fetch(`${BASE}/v1/messages`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-api-key': KEY, 'anthropic-version': '2023-06-01' },
    body: JSON.stringify({ ...b, stream: true }),
  });
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /text\/event-stream/);
  const out = [];
  for (const chunk of (await r.text()).split('\n\n')) {
    const lines = chunk.split('\n').filter((l) => l && !l.startsWith(':'));
    if (!lines.length) continue;
    const ev = lines.find((l) => l.startsWith('event: '));
    const data = lines.find((l) => l.startsWith('data: '));
    assert.ok(ev && data, `an SSE event has event: and data: lines (${chunk})`);
    out.push({ event: ev.slice(7), data: JSON.parse(data.slice(6)) });
  }
  return out;
}

// The Messages event grammar: message_start, ping, blocks (start, deltas, stop) with
// consecutive indexes, signature_delta closing a thinking block, message_delta, message_stop.
function checkEventOrder(evs) {
  for (const e of evs) assert.equal(e.event, e.data.type, 'event: line names data.type');
  assert.equal(evs[0].event, 'message_start');
  assert.deepEqual(evs[0].data.message.content, []);
  assert.equal(evs[1].event, 'ping');
  assert.equal(evs.at(-1).event, 'message_stop');
  assert.equal(evs.at(-2).event, 'message_delta');
  let open = null, next = 0, sawSig = false;
  for (const { event, data } of evs.slice(2, -2)) {
    if (event === 'content_block_start') {
      assert.equal(open, null);
      assert.equal(data.index, next++);
      open = data.content_block.type;
      sawSig = false;
    } else if (event === 'content_block_delta') {
      assert.equal(data.index, next - 1);
      const want = { text: ['text_delta'], thinking: ['thinking_delta', 'signature_delta'], tool_use: ['input_json_delta'] };
      assert.ok(want[open].includes(data.delta.type), `${data.delta.type} in a ${open} block`);
      if (data.delta.type === 'signature_delta') sawSig = true;
    } else if (event === 'content_block_stop') {
      assert.equal(data.index, next - 1);
      if (open === 'thinking') assert.ok(sawSig, 'signature_delta before a thinking block stops');
      open = null;
    } else assert.fail(`unexpected event ${event}`);
  }
  assert.equal(open, null, 'every block stopped');
}

test('raw stream: event names, order and usage match the non-streaming reply', async () => {
  const b = body({ thinking: { type: 'adaptive' }, max_tokens: 24 });
  const whole = await anthropic.messages.create(b);
  const evs = await rawEvents(b);
  checkEventOrder(evs);
  const delta = evs.at(-2).data;
  assert.equal(delta.delta.stop_reason, whole.stop_reason);
  assert.equal(delta.usage.output_tokens, whole.usage.output_tokens);
  assert.equal(delta.usage.input_tokens + delta.usage.cache_read_input_tokens, prompt(whole));
  const start = evs[0].data.message.usage;
  assert.equal(start.input_tokens + start.cache_read_input_tokens, prompt(whole));
});

test('thinking: enabled with a budget returns thinking blocks that stream identically', async () => {
  const b = body({ max_tokens: 1100, thinking: { type: 'enabled', budget_tokens: 1024 } });
  const whole = await anthropic.messages.create(b);
  checkMessage(whole);
  // greedy tiny41 writes some reasoning before </think>: without it this test would be vacuous
  assert.equal(whole.content[0]?.type, 'thinking');
  const off = await anthropic.messages.countTokens({ model: MODEL, messages: b.messages });
  const on = await anthropic.messages.countTokens({ model: MODEL, messages: b.messages, thinking: b.thinking });
  assert.ok(on.input_tokens > off.input_tokens, 'thinking mode renders the effort line');
  assert.equal(prompt(whole), on.input_tokens);
  const fin = await anthropic.messages.stream(b).finalMessage();
  sameContent(fin.content, whole.content);
  // the thinking block (and its signature) goes back in history without error
  const follow = await anthropic.messages.create({
    ...b, messages: [...b.messages, { role: 'assistant', content: whole.content.length ? whole.content : 'ok' },
      { role: 'user', content: 'Go on' }],
  });
  checkMessage(follow);
});

test('stop_sequences: a string the model emits ends the reply with stop_reason stop_sequence', async () => {
  const first = await anthropic.messages.create(body({ max_tokens: 24 }));
  const text = first.content.filter((x) => x.type === 'text').map((x) => x.text).join('');
  const at = [...text].findIndex((ch, i) => i > 0 && /[A-Za-z]/.test(ch));
  if (at < 0) return assert.fail(`no letter in the reply to stop on: ${JSON.stringify(text)}`);
  const stop = [...text][at];
  const m = await anthropic.messages.create(body({ max_tokens: 24, stop_sequences: [stop, 'never-emitted-xyz'] }));
  checkMessage(m);
  assert.equal(m.stop_reason, 'stop_sequence');
  assert.equal(m.stop_sequence, stop);
  const got = m.content.filter((x) => x.type === 'text').map((x) => x.text).join('');
  assert.equal(got, text.slice(0, text.indexOf(stop)));
  const fin = await anthropic.messages.stream(body({ max_tokens: 24, stop_sequences: [stop] })).finalMessage();
  assert.equal(fin.stop_reason, 'stop_sequence');
  assert.equal(fin.stop_sequence, stop);
});

test('tools: a reply with tools parses; tool_choice any / tool force a call, auto / none do not', async () => {
  const validInput = new Ajv({ strict: false }).compile(weather.input_schema);
  for (const tool_choice of [{ type: 'auto' }, { type: 'any', disable_parallel_tool_use: true },
    { type: 'tool', name: 'get_weather' }, { type: 'none' }]) {
    const forced = tool_choice.type === 'any' || tool_choice.type === 'tool';
    // a forced call needs room for the shortest valid DSML call (the server refuses less)
    const m = await anthropic.messages.create(body({ tools: [weather], tool_choice, max_tokens: forced ? 400 : 32 }));
    checkMessage(m);
    const uses = m.content.filter((x) => x.type === 'tool_use');
    for (const b of uses) assert.equal(b.name, 'get_weather');
    if (forced) {
      assert.equal(m.stop_reason, 'tool_use', `tool_choice ${tool_choice.type}: ${JSON.stringify(m.content)}`);
      assert.equal(uses.length, 1, 'disable_parallel_tool_use / a named tool: exactly one call');
      assert.ok(validInput(uses[0].input), JSON.stringify(validInput.errors));
    }
  }
});

test('tools: with tool_choice any every sampled reply is a call whose input validates (10 draws)', async () => {
  const validInput = new Ajv({ strict: false }).compile(weather.input_schema);
  for (let i = 0; i < 10; i++) {
    const m = await anthropic.messages.create(body({ tools: [weather], tool_choice: { type: 'any' }, max_tokens: 400,
      temperature: 1, messages: [{ role: 'user', content: `Weather, please (${i})` }] }));
    checkMessage(m);
    const uses = m.content.filter((x) => x.type === 'tool_use');
    assert.equal(m.stop_reason, 'tool_use');
    assert.ok(uses.length >= 1 && uses.every((u) => u.name === 'get_weather' && validInput(u.input)),
      JSON.stringify(m.content));
  }
});

test('a forced tool with too small a max_tokens is a 400 naming max_tokens', async () => {
  await assert.rejects(anthropic.messages.create(body({ tools: [weather], tool_choice: { type: 'any' }, max_tokens: 8 })),
    (e) => e instanceof Anthropic.BadRequestError && /max_tokens/.test(e.message));
});

test('tools: round trip with tool_result (and is_error) gives a reply, streamed identically', async () => {
  const call = { type: 'tool_use', id: 'toolu_01A09q90qw90lq917835lq9', name: 'get_weather', input: { city: 'Paris' } };
  const first = await anthropic.messages.create(body({ tools: [weather], max_tokens: 32,
    messages: [{ role: 'user', content: 'Weather in Paris?' }] }));
  checkMessage(first);
  // the model's own call when it made one, else a well-formed call in its place
  const calls = first.content.filter((x) => x.type === 'tool_use');
  const assistant = calls.length ? first.content : [{ type: 'text', text: 'Let me check.' }, call];
  const uses = calls.length ? calls : [call];
  const turn = (is_error) => ({
    role: 'user',
    content: uses.map((u) => ({ type: 'tool_result', tool_use_id: u.id, is_error,
      content: is_error ? 'city not found' : [{ type: 'text', text: '18 C, sunny' }] })),
  });
  for (const is_error of [false, true]) {
    const b = body({ tools: [weather], max_tokens: 16,
      messages: [{ role: 'user', content: 'Weather in Paris?' }, { role: 'assistant', content: assistant }, turn(is_error)] });
    const m = await anthropic.messages.create(b);
    checkMessage(m);
    const fin = await anthropic.messages.stream(b).finalMessage();
    sameContent(fin.content, m.content);
    const { max_tokens, temperature, ...cb } = b;
    assert.equal((await anthropic.messages.countTokens(cb)).input_tokens, prompt(m));
  }
  // is_error is visible to the model: the error result renders more tokens than a plain one
  const count = async (is_error) => (await anthropic.messages.countTokens({ model: MODEL, tools: [weather],
    messages: [{ role: 'user', content: 'Weather?' }, { role: 'assistant', content: [call] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: call.id, is_error, content: 'x' }] }] })).input_tokens;
  assert.ok((await count(true)) > (await count(false)));
});

test('consecutive user turns are merged as Anthropic merges them', async () => {
  const split = await anthropic.messages.countTokens({ model: MODEL,
    messages: [{ role: 'user', content: 'a' }, { role: 'user', content: [{ type: 'text', text: 'b' }] }] });
  const one = await anthropic.messages.countTokens({ model: MODEL,
    messages: [{ role: 'user', content: [{ type: 'text', text: 'a' }, { type: 'text', text: 'b' }] }] });
  assert.equal(split.input_tokens, one.input_tokens);
});

test('errors are Anthropic errors the SDK raises as its classes', async () => {
  const isErr = (cls, status, type, re) => (e) => {
    assert.ok(e instanceof cls, `${e.constructor.name}: ${e.message}`);
    assert.equal(e.status, status);
    assert.equal(e.error?.type, 'error');
    assert.equal(e.error?.error?.type, type);
    if (re) assert.match(e.error.error.message, re);
    return true;
  };
  await assert.rejects(anthropic.messages.create({ model: MODEL, messages: [{ role: 'user', content: 'x' }] }),
    isErr(Anthropic.BadRequestError, 400, 'invalid_request_error', /max_tokens/));
  await assert.rejects(anthropic.messages.create(body({ messages: [{ role: 'user', content: [
    { type: 'image', source: { type: 'url', url: 'https://example.com/a.png' } }] }] })),
  isErr(Anthropic.BadRequestError, 400, 'invalid_request_error', /image 1: remote image URLs are not fetched/));
  await assert.rejects(anthropic.messages.create(body({ max_tokens: 1000, thinking: { type: 'enabled', budget_tokens: 1024 } })),
    isErr(Anthropic.BadRequestError, 400, 'invalid_request_error', /budget_tokens/));
  await assert.rejects(anthropic.messages.create(body({ tools: [{ type: 'web_search_20250305', name: 'web_search' }] })),
    isErr(Anthropic.BadRequestError, 400, 'invalid_request_error', /tools\.0/));
  const bad = new Anthropic({ baseURL: BASE, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(bad.messages.create(body()), isErr(Anthropic.AuthenticationError, 401, 'authentication_error'));
  await assert.rejects(anthropic.messages.batches.retrieve('msgbatch_nope'),
    isErr(Anthropic.NotFoundError, 404, 'not_found_error'));
});

test('x-api-key and a bearer key are both accepted; anthropic-version is optional', async () => {
  for (const headers of [{ 'x-api-key': KEY }, { authorization: `Bearer ${KEY}` }]) {
    const r = await fetch(`${BASE}/v1/messages`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers },
      body: JSON.stringify(body({ max_tokens: 4 })) });
    assert.equal(r.status, 200);
    checkMessage(await r.json());
  }
});

test('cancellation: an aborted stream ends, and the server still answers', async () => {
  const stream = anthropic.messages.stream(body({ max_tokens: 4000, temperature: 1 }));
  let n = 0;
  stream.on('streamEvent', () => { if (++n === 3) stream.abort(); });
  await assert.rejects(stream.finalMessage(), (e) => e instanceof Anthropic.APIUserAbortError);
  assert.ok(stream.aborted);
  checkMessage(await anthropic.messages.create(body({ max_tokens: 4 })));
});
