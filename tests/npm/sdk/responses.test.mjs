// responses.test.mjs: POST /v1/responses, GET|DELETE /v1/responses/{id} through the official
// openai client (7.60.0): its create / stream / retrieve / delete methods and its stream
// helper (`responses.stream(...).finalResponse()`, which validates the event sequence, the
// item identities and the indexes) must accept every reply; the Response objects must
// validate against a JSON schema written from the SDK's type definitions
// (resources/responses/responses.d.ts: Response, ResponseOutputMessage, ResponseReasoningItem,
// ResponseFunctionToolCall, ResponseUsage). tiny41 has random weights: the tests assert shapes
// and consistency (stream == non-stream at temperature 0, usage arithmetic, ids, statuses),
// never specific text.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import Ajv from 'ajv';
import OpenAI from 'openai';
import { openai, MODEL } from './common.mjs';

// ---- the Response shape, from responses.d.ts -------------------------------------------------
const str = { type: 'string' };
const int = { type: 'integer', minimum: 0 };
const status3 = { enum: ['in_progress', 'completed', 'incomplete'] };
const outputText = {
  type: 'object', required: ['type', 'text', 'annotations'],
  properties: { type: { const: 'output_text' }, text: str, annotations: { type: 'array' } },
};
const messageItem = {
  type: 'object', required: ['id', 'type', 'role', 'status', 'content'],
  properties: {
    id: { type: 'string', pattern: '^msg_' }, type: { const: 'message' }, role: { const: 'assistant' },
    status: status3, content: { type: 'array', items: outputText },
  },
};
const reasoningItem = {
  type: 'object', required: ['id', 'type', 'summary'],
  properties: {
    id: { type: 'string', pattern: '^rs_' }, type: { const: 'reasoning' }, status: status3,
    summary: { type: 'array', items: { type: 'object', required: ['type', 'text'], properties: { type: { const: 'summary_text' }, text: str } } },
    content: { type: 'array', items: { type: 'object', required: ['type', 'text'], properties: { type: { const: 'reasoning_text' }, text: str } } },
  },
};
const callItem = {
  type: 'object', required: ['type', 'call_id', 'name', 'arguments'],
  properties: {
    id: { type: 'string', pattern: '^fc_' }, type: { const: 'function_call' }, call_id: { type: 'string', minLength: 1 },
    name: str, arguments: str, status: status3,
  },
};
const usage = {
  type: 'object', required: ['input_tokens', 'input_tokens_details', 'output_tokens', 'output_tokens_details', 'total_tokens'],
  properties: {
    input_tokens: int, output_tokens: int, total_tokens: int,
    input_tokens_details: { type: 'object', required: ['cached_tokens'], properties: { cached_tokens: int } },
    output_tokens_details: { type: 'object', required: ['reasoning_tokens'], properties: { reasoning_tokens: int } },
  },
};
const responseSchema = {
  type: 'object',
  required: ['id', 'object', 'created_at', 'error', 'incomplete_details', 'instructions', 'metadata', 'model', 'output',
    'parallel_tool_calls', 'temperature', 'tool_choice', 'tools', 'top_p', 'status'],
  properties: {
    id: { type: 'string', pattern: '^resp_' }, object: { const: 'response' }, created_at: { type: 'number' },
    status: { enum: ['completed', 'failed', 'in_progress', 'cancelled', 'queued', 'incomplete'] },
    error: { anyOf: [{ type: 'null' }, { type: 'object', required: ['code', 'message'] }] },
    incomplete_details: { anyOf: [{ type: 'null' }, { type: 'object', properties: { reason: { enum: ['max_output_tokens', 'content_filter'] } } }] },
    instructions: { type: ['string', 'null', 'array'] }, metadata: { type: ['object', 'null'] }, model: str,
    output: { type: 'array', items: { anyOf: [messageItem, reasoningItem, callItem] } },
    parallel_tool_calls: { type: 'boolean' }, temperature: { type: ['number', 'null'] }, top_p: { type: ['number', 'null'] },
    tool_choice: { anyOf: [{ enum: ['none', 'auto', 'required'] }, { type: 'object', required: ['type'] }] },
    tools: { type: 'array', items: { type: 'object', required: ['type', 'name', 'parameters', 'strict'] } },
    max_output_tokens: { type: ['integer', 'null'] }, previous_response_id: { type: ['string', 'null'] },
    reasoning: { type: ['object', 'null'] }, text: { type: 'object' }, store: { type: 'boolean' },
    usage: { anyOf: [{ type: 'null' }, usage] },
  },
};
// output_text is computed by the SDK, not sent (the wire object must not carry it)
const wireSchema = { ...responseSchema, not: { required: ['output_text'] } };
const ajv = new Ajv({ allErrors: true, strict: false });
const validResponse = ajv.compile(responseSchema);
const validWire = ajv.compile(wireSchema);

function checkResponse(r, what) {
  assert.ok(validResponse(r), `${what}: ${ajv.errorsText(validResponse.errors)}`);
  if (r.usage) assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens, `${what}: total_tokens`);
  if (r.status === 'incomplete') assert.equal(r.incomplete_details?.reason, 'max_output_tokens', `${what}: reason`);
  if (r.status === 'completed') assert.equal(r.incomplete_details, null);
  const texts = r.output.filter((o) => o.type === 'message').flatMap((o) => o.content.map((c) => c.text));
  assert.equal(r.output_text, texts.join(''), `${what}: the SDK's output_text`);
  const ids = r.output.map((o) => o.id);
  assert.equal(new Set(ids).size, ids.length, `${what}: item ids are unique`);
}

// The raw wire events of a streaming create (the SDK's Stream parses each SSE event).
async function rawEvents(body) {
  const stream = await openai.responses.create({ ...body, stream: true });
  const events = [];
  for await (const ev of stream) events.push(ev);
  return events;
}

// Checks a raw event list: sequence numbers 0, 1, 2, ...; lifecycle first and last; every
// item-scoped event names the item added at its output_index; deltas add up to the .done text.
function checkEvents(events) {
  assert.deepEqual(events.map((e) => e.sequence_number), events.map((_, i) => i), 'sequence_number 0, 1, 2, ...');
  assert.equal(events[0].type, 'response.created');
  assert.equal(events[1].type, 'response.in_progress');
  const last = events[events.length - 1];
  assert.ok(['response.completed', 'response.incomplete'].includes(last.type), last.type);
  assert.ok(validWire(last.response), ajv.errorsText(validWire.errors));
  const items = [];
  const acc = new Map(); // output_index -> accumulated delta text
  const parts = new Map(); // output_index -> content parts added, done
  for (const e of events.slice(2, -1)) {
    if (e.type === 'response.output_item.added') {
      assert.equal(e.output_index, items.length, 'items are added in order');
      items.push(e.item);
      acc.set(e.output_index, '');
      continue;
    }
    const it = items[e.output_index];
    assert.ok(it, `${e.type}: output_index ${e.output_index} was added`);
    if ('item_id' in e) assert.equal(e.item_id, it.id, `${e.type}: item_id`);
    if ('content_index' in e) assert.equal(e.content_index, 0);
    const p = parts.get(e.output_index) ?? { added: 0, done: 0 };
    parts.set(e.output_index, p);
    if (/^response\.(output_text|reasoning_text)\./.test(e.type)) assert.equal(p.added - p.done, 1, `${e.type} outside its content part`);
    switch (e.type) {
      case 'response.output_text.delta': assert.equal(it.type, 'message'); acc.set(e.output_index, acc.get(e.output_index) + e.delta); break;
      case 'response.reasoning_text.delta': assert.equal(it.type, 'reasoning'); acc.set(e.output_index, acc.get(e.output_index) + e.delta); break;
      case 'response.function_call_arguments.delta': assert.equal(it.type, 'function_call'); acc.set(e.output_index, acc.get(e.output_index) + e.delta); break;
      case 'response.output_text.done': case 'response.reasoning_text.done': assert.equal(e.text, acc.get(e.output_index)); break;
      case 'response.function_call_arguments.done': assert.equal(e.arguments, acc.get(e.output_index)); break;
      case 'response.content_part.added':
        assert.equal(e.part.type, it.type === 'message' ? 'output_text' : 'reasoning_text'); p.added++; break;
      case 'response.content_part.done': assert.equal(e.part.text, acc.get(e.output_index)); p.done++; break;
      case 'response.output_item.done':
        assert.equal(e.item.id, it.id);
        if (it.type !== 'function_call') assert.ok(p.added === 1 && p.done === 1, `${it.type} item without its content part`);
        break;
      default: assert.fail(`unexpected event ${e.type}`);
    }
  }
  assert.deepEqual(last.response.output.map((o) => o.id), items.map((o) => o.id), 'the final output is the streamed items');
  return last.response;
}

const ASK = { model: MODEL, input: 'Hello there', max_output_tokens: 12, temperature: 0, seed: 3 };

test('non-streaming create: the Response parses and has the documented shape', async () => {
  const r = await openai.responses.create({ ...ASK, reasoning: { effort: 'none' }, metadata: { run: 'a' }, user: 'u1' });
  checkResponse(r, 'create');
  assert.ok(['completed', 'incomplete'].includes(r.status));
  assert.equal(r.model, MODEL);
  assert.equal(r.max_output_tokens, 12);
  assert.deepEqual(r.metadata, { run: 'a' });
  assert.equal(r.user, 'u1');
  assert.equal(r.store, true);
  assert.equal(r.previous_response_id, null);
  assert.ok(r.usage.output_tokens > 0 && r.usage.output_tokens <= 12);
  assert.equal(r.usage.output_tokens_details.reasoning_tokens, 0, 'reasoning off: no reasoning tokens');
  assert.ok(!r.output.some((o) => o.type === 'reasoning'));
});

// Same-request replies compared: item types, texts / arguments, status and usage.
function sameReply(a, b) {
  const view = (r) => r.output.map((o) => [o.type, o.id.split('_')[0], o.status, o.content?.map((c) => [c.type, c.text]) ?? o.arguments]);
  assert.deepEqual(view(a), view(b));
  assert.equal(a.status, b.status);
  assert.equal(a.usage.output_tokens, b.usage.output_tokens);
  assert.equal(a.usage.output_tokens_details.reasoning_tokens, b.usage.output_tokens_details.reasoning_tokens);
}

test('stream: raw events are consistent and equal the non-streaming reply at temperature 0', async () => {
  for (const effort of ['none', 'high']) {
    const body = { ...ASK, reasoning: { effort } };
    const whole = await openai.responses.create(body);
    sameReply(checkEvents(await rawEvents(body)), whole);
  }
});

test('stream: reasoning then a message in one stream (a seed where the reasoning ends)', async () => {
  // tiny41's random weights end the reasoning early for some seeds only: find one, then
  // stream the same request (same seed: the same tokens)
  let found = null;
  for (let seed = 1; seed <= 16 && !found; seed++) {
    const body = { ...ASK, temperature: 1, seed, max_output_tokens: 48, reasoning: { effort: 'high' } };
    const r = await openai.responses.create(body);
    if (r.output.some((o) => o.type === 'reasoning') && r.output.some((o) => o.type === 'message')) found = { body, r };
  }
  assert.ok(found, 'no seed in 1..16 ended the reasoning within 48 tokens');
  const { body, r } = found;
  const rt = r.usage.output_tokens_details.reasoning_tokens;
  assert.ok(rt > 0 && rt < r.usage.output_tokens, `reasoning_tokens ${rt} of ${r.usage.output_tokens}`);
  const events = await rawEvents(body);
  sameReply(checkEvents(events), r);
  const types = events.map((e) => e.type);
  assert.ok(types.indexOf('response.reasoning_text.done') < types.indexOf('response.output_text.delta'));
  const helper = await openai.responses.stream(body).finalResponse();
  sameReply(helper, r);
  assert.equal(helper.output_text, r.output_text);
});

test('stream: the SDK stream helper accepts the sequence and its finalResponse matches', async () => {
  for (const effort of ['none', 'high']) {
    const body = { ...ASK, reasoning: { effort }, max_output_tokens: 24 };
    const whole = await openai.responses.create(body);
    const stream = openai.responses.stream(body);
    let deltas = '';
    stream.on('response.output_text.delta', (e) => { deltas += e.delta; });
    const fin = await stream.finalResponse();
    checkResponse(fin, 'finalResponse');
    sameReply(fin, whole);
    assert.equal(fin.output_text, whole.output_text);
    assert.equal(deltas, fin.output_text);
    if (effort === 'none') assert.ok(fin.output_text.length > 0, 'reasoning off: a message');
  }
});

test('reasoning on: a reasoning item with reasoning_text content and counted reasoning tokens', async () => {
  const r = await openai.responses.create({ ...ASK, input: 'Think about it', reasoning: { effort: 'high' } });
  checkResponse(r, 'reasoning');
  assert.equal(r.reasoning.effort, 'high');
  assert.equal(r.output[0].type, 'reasoning', 'thinking starts the output');
  assert.equal(r.output[0].content[0].type, 'reasoning_text');
  const rt = r.usage.output_tokens_details.reasoning_tokens;
  assert.ok(rt > 0 && rt <= r.usage.output_tokens, `reasoning_tokens ${rt} of ${r.usage.output_tokens}`);
  // the reasoning item goes back as history: the next turn renders and runs
  const r2 = await openai.responses.create({ ...ASK, input: [{ role: 'user', content: 'Think about it' }, r.output[0], { role: 'user', content: 'Go on' }], reasoning: { effort: 'high' } });
  checkResponse(r2, 'reasoning history');
});

test('tools: function tools echo, and a call round trip with function_call_output', async () => {
  const tools = [{ type: 'function', name: 'get_weather', description: 'Weather of a city', strict: false,
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }];
  // a required tool is guaranteed (constrained decoding); it needs room for the shortest valid call
  const r = await openai.responses.create({ ...ASK, max_output_tokens: 400, input: 'Weather in Paris?', tools,
    tool_choice: 'required', parallel_tool_calls: false });
  checkResponse(r, 'tools');
  assert.equal(r.tool_choice, 'required');
  assert.equal(r.parallel_tool_calls, false);
  assert.deepEqual(r.tools.map((t) => [t.type, t.name, t.strict]), [['function', 'get_weather', false]]);
  const calls = r.output.filter((o) => o.type === 'function_call');
  assert.equal(calls.length, 1, 'tool_choice required, parallel_tool_calls false: exactly one call');
  const validArgs = new Ajv({ strict: false }).compile(tools[0].parameters);
  assert.equal(calls[0].name, 'get_weather');
  assert.ok(validArgs(JSON.parse(calls[0].arguments)), `${calls[0].arguments}: ${JSON.stringify(validArgs.errors)}`);
  // The model's call goes back with its result: through previous_response_id, and as explicit input items.
  const prev = r.id;
  const outputs = calls.map((c) => ({ type: 'function_call_output', call_id: c.call_id, output: '{"temperature_c": 21}' }));
  const r2 = await openai.responses.create({ ...ASK, tools, previous_response_id: prev, input: outputs });
  checkResponse(r2, 'tool result');
  assert.equal(r2.previous_response_id, prev);
  const r3 = await openai.responses.create({ ...ASK, max_output_tokens: 400, tools, tool_choice: { type: 'function', name: 'get_weather' }, input: [
    { role: 'user', content: 'Weather in Paris?' },
    { type: 'function_call', call_id: 'c1', name: 'get_weather', arguments: '{"city":"Paris"}' },
    { type: 'function_call_output', call_id: 'c1', output: [{ type: 'input_text', text: '21 C' }] }] });
  checkResponse(r3, 'explicit tool history');
  assert.deepEqual(r3.tool_choice, { type: 'function', name: 'get_weather' });
  const c3 = r3.output.filter((o) => o.type === 'function_call');
  assert.ok(c3.length >= 1 && c3.every((c) => c.name === 'get_weather' && validArgs(JSON.parse(c.arguments))), JSON.stringify(r3.output));
});

test('tools: with tool_choice required every sampled reply is a call whose arguments validate (10 draws)', async () => {
  const tools = [{ type: 'function', name: 'plan', strict: false, parameters: { type: 'object', required: ['city', 'days'],
    properties: { city: { type: 'string' }, days: { type: 'integer' }, mode: { enum: ['car', 'train'] } } } }];
  const validArgs = new Ajv({ strict: false }).compile(tools[0].parameters);
  for (let i = 0; i < 10; i++) {
    const r = await openai.responses.create({ model: MODEL, input: `Plan a trip (${i})`, tools, tool_choice: 'required',
      max_output_tokens: 400, temperature: 1, reasoning: { effort: 'none' } });
    checkResponse(r, `draw ${i}`);
    const calls = r.output.filter((o) => o.type === 'function_call');
    assert.ok(calls.length >= 1, `draw ${i}: no call in ${JSON.stringify(r.output)}`);
    for (const c of calls) assert.ok(c.name === 'plan' && validArgs(JSON.parse(c.arguments)), c.arguments);
  }
});

test('a required tool with too small a max_output_tokens is a 400 naming max_output_tokens', async () => {
  const tools = [{ type: 'function', name: 'f', parameters: { type: 'object', properties: { a: { type: 'string' } } } }];
  await assert.rejects(openai.responses.create({ ...ASK, max_output_tokens: 4, tools, tool_choice: 'required' }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'max_output_tokens' && /'max_output_tokens'/.test(e.message));
});

test('store and previous_response_id: the follow-up continues the conversation from the cache', async () => {
  // instructions are not carried over from the previous response (as OpenAI documents): a
  // client repeats them, which keeps the rendered prefix the same
  const base = { ...ASK, reasoning: { effort: 'none' }, max_output_tokens: 8, instructions: 'Be brief.' };
  const r1 = await openai.responses.create({ ...base, input: 'Tell me a story' });
  checkResponse(r1, 'r1');
  const r2 = await openai.responses.create({ ...base, input: 'Go on', previous_response_id: r1.id });
  checkResponse(r2, 'r2');
  assert.equal(r2.previous_response_id, r1.id);
  // the slot still holds r1's prompt and output: at least r1's prompt is served from the cache
  assert.ok(r2.usage.input_tokens_details.cached_tokens >= r1.usage.input_tokens,
    `cached ${r2.usage.input_tokens_details.cached_tokens} < r1's ${r1.usage.input_tokens} input tokens`);
  // the same conversation sent explicitly renders the same prompt
  const explicit = await openai.responses.create({ ...base, input: [
    { role: 'user', content: 'Tell me a story' }, ...r1.output, { role: 'user', content: 'Go on' }] });
  assert.equal(r2.usage.input_tokens, explicit.usage.input_tokens, 'previous_response_id == the explicit history');
  const { instructions, ...noInstr } = base;
  const bare = await openai.responses.create({ ...noInstr, input: 'Tell me a story' });
  assert.equal(instructions, r1.instructions);
  assert.ok(r1.usage.input_tokens > bare.usage.input_tokens, 'instructions are in the prompt');
  // a chain of two
  const r3 = await openai.responses.create({ ...base, input: 'And then?', previous_response_id: r2.id });
  assert.ok(r3.usage.input_tokens > r2.usage.input_tokens + r2.usage.output_tokens - 1);
  assert.ok(r3.usage.input_tokens_details.cached_tokens >= r2.usage.input_tokens);
});

test('GET and DELETE /v1/responses/{id}', async () => {
  const r = await openai.responses.create({ ...ASK, reasoning: { effort: 'none' }, max_output_tokens: 6 });
  const got = await openai.responses.retrieve(r.id);
  checkResponse(got, 'retrieve');
  assert.deepEqual({ ...got, output_text: undefined }, { ...r, output_text: undefined });
  await openai.responses.delete(r.id);
  await assert.rejects(openai.responses.retrieve(r.id), (e) => e instanceof OpenAI.NotFoundError && e.status === 404);
  const unstored = await openai.responses.create({ ...ASK, reasoning: { effort: 'none' }, max_output_tokens: 4, store: false });
  assert.equal(unstored.store, false);
  await assert.rejects(openai.responses.retrieve(unstored.id), OpenAI.NotFoundError);
});

test('404s: unknown ids and an unknown previous_response_id, in OpenAI error shape', async () => {
  await assert.rejects(openai.responses.retrieve('resp_doesnotexist'),
    (e) => e instanceof OpenAI.NotFoundError && /resp_doesnotexist/.test(e.message));
  await assert.rejects(openai.responses.create({ ...ASK, previous_response_id: 'resp_gone' }),
    (e) => e instanceof OpenAI.NotFoundError && e.param === 'previous_response_id' && /resp_gone/.test(e.message));
});

test('400s name the problem', async () => {
  const bad = async (body, re) => assert.rejects(openai.responses.create({ ...ASK, ...body }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && re.test(e.message), String(re));
  await bad({ tools: [{ type: 'web_search' }] }, /web_search/);
  await bad({ input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'http://x/y.png' }] }] },
    /remote image URLs are not fetched/);
  await bad({ input: [{ role: 'user', content: [{ type: 'input_file', file_id: 'f' }] }] }, /input_file/);
  await bad({ input: [{ type: 'item_reference', id: 'x' }] }, /item_reference/);
  await bad({ temperature: 'hot' }, /temperature/);
  await bad({ input: 42 }, /input/);
  await bad({ max_output_tokens: 0 }, /max_output_tokens/);
  await bad({ text: { format: { type: 'json_schema', name: 'x' } } }, /schema/);
  await bad({ tool_choice: { type: 'file_search' } }, /file_search/);
  await bad({ input: [{ role: 'wizard', content: 'x' }] }, /wizard/);
  await bad({ input: [{ type: 'function_call_output', output: 'x' }] }, /call_id/);
  // a prompt over the context: the chat path's limit, named with the Responses field
  await assert.rejects(openai.responses.create({ ...ASK, input: 'word '.repeat(20000) }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'input' && /maximum context length/.test(e.message));
  await assert.rejects(openai.responses.create({ ...ASK, input: 'hi', max_output_tokens: 1 << 24 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'max_output_tokens');
});

test('text.format json_schema is accepted and echoed', async () => {
  const format = { type: 'json_schema', name: 'city', strict: true,
    schema: { type: 'object', properties: { name: { type: 'string' } }, required: ['name'], additionalProperties: false } };
  const r = await openai.responses.create({ ...ASK, reasoning: { effort: 'none' }, text: { format } });
  checkResponse(r, 'json_schema');
  assert.deepEqual(r.text.format, format);
});

test('a wrong key is a 401 AuthenticationError', async () => {
  const bad = new OpenAI({ baseURL: openai.baseURL, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(bad.responses.create({ model: MODEL, input: 'x' }),
    (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
});

test('cancellation: an aborted stream is dropped and the server answers the next request', async () => {
  const stream = openai.responses.stream({ ...ASK, max_output_tokens: 400, reasoning: { effort: 'high' } });
  let id = null, n = 0;
  for await (const ev of stream) {
    if (ev.type === 'response.created') id = ev.response.id;
    if (ev.type.endsWith('.delta') && ++n === 2) break; // leaving the loop aborts the request
  }
  assert.ok(id && n === 2);
  const r = await openai.responses.create({ ...ASK, reasoning: { effort: 'none' }, max_output_tokens: 4 });
  checkResponse(r, 'after abort');
  // a cancelled response is not stored
  await assert.rejects(openai.responses.retrieve(id), OpenAI.NotFoundError);
});
