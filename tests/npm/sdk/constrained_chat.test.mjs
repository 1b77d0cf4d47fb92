// constrained_chat.test.mjs: constrained decoding through the official openai client.
// On tiny41 (random weights) a required tool or a response_format schema must still give a
// reply that parses and validates: the constraint, not the model, makes it valid. The same
// seeds without the constraint give malformed or absent output, which shows exactly that.
// Expected values: the openai SDK's parsed shapes and ajv (an independent JSON-schema
// validator) on the schemas below.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import Ajv from 'ajv';
import OpenAI from 'openai';
import { openai, MODEL } from './common.mjs';

const ajv = new Ajv({ allErrors: true });

// nesting, an enum, a number, strings and arrays
const TRIP = {
  type: 'object',
  properties: {
    city: { type: 'string', minLength: 1, maxLength: 40 },
    unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
    days: { type: 'integer' },
    budget: { type: 'number' },
    stops: {
      type: 'array', maxItems: 3,
      items: {
        type: 'object', additionalProperties: false, required: ['name', 'nights'],
        properties: { name: { type: 'string' }, nights: { type: 'integer' } },
      },
    },
    options: {
      type: 'object', additionalProperties: false, required: ['pets'],
      properties: { pets: { type: 'boolean' }, notes: { type: ['string', 'null'] } },
    },
  },
  required: ['city', 'unit', 'budget', 'stops', 'options'],
  additionalProperties: false,
};
const validTrip = ajv.compile(TRIP);
const TOOLS = [
  { type: 'function', function: { name: 'plan_trip', description: 'Plan a trip', parameters: TRIP } },
  { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {} } } },
];
const SEEDS = Array.from({ length: 50 }, (_, i) => i + 1);
const MAX = 700; // the shortest valid plan_trip call is about 380 bytes; thinking takes the rest
const messages = [{ role: 'user', content: 'Plan a weekend trip to Lisbon.' }];

// Runs f over the seeds, two at a time (the server has two slots).
async function each(f) {
  const out = [];
  for (let i = 0; i < SEEDS.length; i += 2) out.push(...await Promise.all(SEEDS.slice(i, i + 2).map(f)));
  return out;
}

// A valid call of plan_trip: arguments parse and validate.
function tripCall(msg) {
  const calls = msg.tool_calls ?? [];
  if (calls.length !== 1 || calls[0].function.name !== 'plan_trip') return false;
  try { return validTrip(JSON.parse(calls[0].function.arguments)); } catch { return false; }
}

test('tool_choice required: 50 seeds, every reply is one valid call; unconstrained seeds are not', async () => {
  const body = (seed, extra) => ({
    model: MODEL, messages, tools: TOOLS, max_tokens: MAX, seed, parallel_tool_calls: false,
    // odd seeds in chat mode (the block starts the output), even ones thinking first
    ...(seed % 2 ? { thinking: false } : {}), ...extra,
  });
  const got = await each((seed) => openai.chat.completions.create(body(seed, {
    tool_choice: { type: 'function', function: { name: 'plan_trip' } },
  })));
  for (const [i, r] of got.entries()) {
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'tool_calls', `seed ${SEEDS[i]}`);
    assert.ok(tripCall(c.message), `seed ${SEEDS[i]}: ${JSON.stringify(c.message.tool_calls)} ${JSON.stringify(validTrip.errors)}`);
    assert.ok(!c.message.content, `seed ${SEEDS[i]}: content must be empty`);
  }
  const req = await each((seed) => openai.chat.completions.create(body(seed, { tool_choice: 'required' })));
  for (const [i, r] of req.entries()) {
    const calls = r.choices[0].message.tool_calls ?? [];
    assert.equal(calls.length, 1, `seed ${SEEDS[i]}`);
    const args = JSON.parse(calls[0].function.arguments);
    if (calls[0].function.name === 'plan_trip') assert.ok(validTrip(args), `seed ${SEEDS[i]}`);
    else assert.deepEqual([calls[0].function.name, args], ['get_time', {}]);
  }
  const free = await each((seed) => openai.chat.completions.create(body(seed, { tool_choice: 'auto' })));
  const valid = free.filter((r) => tripCall(r.choices[0].message)).length;
  console.log(`unconstrained: ${valid} of ${SEEDS.length} replies hold a valid call`);
  assert.ok(valid <= SEEDS.length / 10, `without the constraint ${valid} of ${SEEDS.length} were valid`);
});

test('response_format json_schema: 50 seeds, every content validates; unconstrained seeds do not', async () => {
  const body = (seed, rf) => ({ model: MODEL, messages, max_tokens: MAX, seed, ...(seed % 2 ? { thinking: false } : {}), ...rf });
  const rf = { response_format: { type: 'json_schema', json_schema: { name: 'trip', schema: TRIP, strict: true } } };
  const got = await each((seed) => openai.chat.completions.create(body(seed, rf)));
  for (const [i, r] of got.entries()) {
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'stop', `seed ${SEEDS[i]}`);
    assert.ok(!c.message.tool_calls?.length);
    let v;
    assert.doesNotThrow(() => { v = JSON.parse(c.message.content); }, `seed ${SEEDS[i]}: ${c.message.content}`);
    assert.ok(validTrip(v), `seed ${SEEDS[i]}: ${c.message.content} ${JSON.stringify(validTrip.errors)}`);
  }
  const free = await each((seed) => openai.chat.completions.create(body(seed, {})));
  const valid = free.filter((r) => { try { return validTrip(JSON.parse(r.choices[0].message.content)); } catch { return false; } }).length;
  console.log(`unconstrained: ${valid} of ${SEEDS.length} contents validate`);
  assert.ok(valid <= SEEDS.length / 10);
});

test('response_format json_object: the content is one JSON object', async () => {
  for (const seed of [1, 2, 3, 4]) {
    const r = await openai.chat.completions.create({
      model: MODEL, messages, max_tokens: 64, seed, thinking: false, response_format: { type: 'json_object' },
    });
    const v = JSON.parse(r.choices[0].message.content);
    assert.ok(v && typeof v === 'object' && !Array.isArray(v), r.choices[0].message.content);
  }
});

test('streaming a required call: the SDK assembles a valid call', async () => {
  const stream = await openai.chat.completions.create({
    model: MODEL, messages, tools: TOOLS, max_tokens: MAX, seed: 7, thinking: false, stream: true,
    tool_choice: { type: 'function', function: { name: 'plan_trip' } },
  });
  let args = '', name = '', finish = null;
  for await (const ch of stream) {
    for (const c of ch.choices) {
      for (const tc of c.delta?.tool_calls ?? []) {
        name += tc.function?.name ?? '';
        args += tc.function?.arguments ?? '';
      }
      finish = c.finish_reason ?? finish;
    }
  }
  assert.equal(name, 'plan_trip');
  assert.equal(finish, 'tool_calls');
  assert.ok(validTrip(JSON.parse(args)), args);
});

test('errors: a budget below the shortest call, and malformed schemas, are 400s', async () => {
  const bad = (extra, what) => assert.rejects(
    openai.chat.completions.create({ model: MODEL, messages, max_tokens: MAX, ...extra }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.message.includes(what), what);
  await bad({ tools: TOOLS, tool_choice: 'required', max_tokens: 20 }, 'max_tokens');
  await bad({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { $ref: '#/$defs/missing' } } } }, 'does not resolve');
  await bad({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'frog' } } } }, 'frog');
  await bad({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { enum: [] } } } }, 'enum');
  await bad({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', properties: { a: 5 } } } } }, 'schema');
  await bad({
    tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: {}, required: ['a'] } } }],
    tool_choice: 'required',
  }, "'a'");
});
