// browser.test.mjs: the chat page (GET /) in a real browser: Debian's chromium, headless, driven
// over the DevTools protocol (chrome-remote-interface), against `dsflash serve` on the tiny
// model, started by tests/e2e/webui.c with an API key.
// Environment: DSF_BASE_URL, DSF_API_KEY, DSF_MODEL (the model id), DSF_SERVER_LOG (the server's
// stderr: its request log), DSF_IMAGE (a PNG to upload), DSF_SCREENSHOT (where the PNG goes),
// CHROMIUM (the browser binary).
// Replies the tiny model cannot be made to write (an XSS payload, a tool call) are injected by
// intercepting the page's request in the browser (Fetch domain): the page is what is tested.
// The long reply that "stop" interrupts is the real server's, with ignore_eos added on the way.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import CDP from 'chrome-remote-interface';

const BASE = process.env.DSF_BASE_URL;
const KEY = process.env.DSF_API_KEY;
const MODEL = process.env.DSF_MODEL;
const LOG = process.env.DSF_SERVER_LOG;
const IMAGE = process.env.DSF_IMAGE;
const SHOT = process.env.DSF_SCREENSHOT;
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function launch() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'dsf-chromium-'));
  const proc = spawn(CHROMIUM, ['--headless=new', '--no-sandbox', '--disable-gpu', '--no-first-run',
    '--no-default-browser-check', '--disable-extensions', '--disable-background-networking', '--disable-sync',
    '--disable-component-update', '--disable-dev-shm-usage', '--remote-debugging-port=0', `--user-data-dir=${dir}`,
    '--window-size=1280,860', 'about:blank'], { stdio: ['ignore', 'ignore', 'pipe'] });
  let err = '';
  const port = await new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`chromium did not start in 30 s: ${err.slice(-2000)}`)), 30000);
    proc.stderr.on('data', (d) => {
      err += d;
      const m = /DevTools listening on ws:\/\/[^:]+:(\d+)\//.exec(err);
      if (m) { clearTimeout(t); resolve(Number(m[1])); }
    });
    proc.on('exit', (c) => { clearTimeout(t); reject(new Error(`chromium exited (${c}): ${err.slice(-2000)}`)); });
  });
  return { proc, dir, port };
}

test('the chat page in chromium', { timeout: 150000 }, async () => {
  assert.ok(BASE && KEY && MODEL && LOG && SHOT, 'DSF_BASE_URL, DSF_API_KEY, DSF_MODEL, DSF_SERVER_LOG, DSF_SCREENSHOT');
  const b = await launch();
  let client;
  try {
    const targets = await CDP.List({ port: b.port });
    const page = targets.find((t) => t.type === 'page');
    client = await CDP({ port: b.port, target: page });
    await run(client);
  } finally {
    const exited = new Promise((r) => { if (b.proc.exitCode !== null) r(); else b.proc.on('exit', r); });
    if (client) {
      await client.Browser.close().catch(() => {});
      await client.close().catch(() => {});
    }
    await Promise.race([exited, sleep(5000)]);
    b.proc.kill('SIGKILL');
    await Promise.race([exited, sleep(2000)]);
    try { fs.rmSync(b.dir, { recursive: true, force: true, maxRetries: 5, retryDelay: 200 }); } catch { /* a temp dir */ }
  }
});

async function run(client) {
  const { Page, Runtime, Log, Fetch, Input, DOM, Emulation } = client;
  const errors = [], dialogs = [], requests = [];
  const plan = []; // what to do with the next chat requests: 'long', 'pass', or an SSE body to answer with
  let realVision = null;

  Runtime.exceptionThrown(({ exceptionDetails: e }) => errors.push(`exception: ${e.text} ${e.exception?.description || ''}`));
  Runtime.consoleAPICalled(({ type, args }) => {
    if (type === 'error' || type === 'assert') errors.push(`console.${type}: ${args.map((a) => a.value ?? a.description).join(' ')}`);
  });
  Log.entryAdded(({ entry }) => { if (entry.level === 'error') errors.push(`log: ${entry.source}: ${entry.text} ${entry.url || ''}`); });
  Page.javascriptDialogOpening(({ type, message }) => {
    dialogs.push(`${type}: ${message}`);
    Page.handleJavaScriptDialog({ accept: false }).catch(() => {});
  });
  Fetch.requestPaused(async ({ requestId, request, responseStatusCode }) => {
    try {
      if (request.url.endsWith('/v1/models')) {
        const { body, base64Encoded } = await Fetch.getResponseBody({ requestId });
        const j = JSON.parse(base64Encoded ? Buffer.from(body, 'base64').toString() : body);
        const m = j.data[0];
        realVision = (m.capabilities || []).includes('vision') || !!(m.meta && m.meta.vision);
        if (!realVision) m.capabilities = ['vision']; // the page's side of images, without a projector
        await Fetch.fulfillRequest({ requestId, responseCode: responseStatusCode,
          responseHeaders: [{ name: 'Content-Type', value: 'application/json' }],
          body: Buffer.from(JSON.stringify(j)).toString('base64') });
        return;
      }
      const raw = request.postDataEntries
        ? Buffer.concat(request.postDataEntries.map((e) => Buffer.from(e.bytes || '', 'base64'))).toString()
        : request.postData;
      const body = JSON.parse(raw);
      requests.push(body);
      const what = plan.shift() || 'pass';
      if (what === 'long') { // a reply long enough to stop
        body.ignore_eos = true;
        body.max_tokens = 6000;
        await Fetch.continueRequest({ requestId, postData: Buffer.from(JSON.stringify(body)).toString('base64') });
      } else if (what === 'pass') {
        await Fetch.continueRequest({ requestId });
      } else {
        await Fetch.fulfillRequest({ requestId, responseCode: 200,
          responseHeaders: [{ name: 'Content-Type', value: 'text/event-stream' }],
          body: Buffer.from(what).toString('base64') });
      }
    } catch (e) {
      errors.push(`interception: ${e.message}`);
    }
  });
  await Promise.all([Page.enable(), Runtime.enable(), Log.enable(), DOM.enable(),
    Fetch.enable({ patterns: [{ urlPattern: '*/v1/chat/completions', requestStage: 'Request' },
      { urlPattern: '*/v1/models', requestStage: 'Response' }] })]);

  const js = async (expression) => {
    const r = await Runtime.evaluate({ expression, returnByValue: true, awaitPromise: true });
    if (r.exceptionDetails) throw new Error(`${expression}: ${r.exceptionDetails.exception?.description || r.exceptionDetails.text}`);
    return r.result.value;
  };
  const waitFor = async (expression, what, ms = 30000) => {
    const t0 = Date.now();
    for (;;) {
      const v = await js(expression);
      if (v) return v;
      if (Date.now() - t0 > ms) throw new Error(`timed out waiting for ${what} (${expression})`);
      await sleep(25);
    }
  };
  const key = async (k, code, vk, modifiers = 0, text) => {
    await Input.dispatchKeyEvent({ type: 'keyDown', key: k, code, windowsVirtualKeyCode: vk, modifiers, text });
    await Input.dispatchKeyEvent({ type: 'keyUp', key: k, code, windowsVirtualKeyCode: vk, modifiers });
  };
  const enter = (mod = 0) => key('Enter', 'Enter', 13, mod, '\r');
  const type = async (sel, text) => { await js(`document.querySelector(${JSON.stringify(sel)}).focus()`); await Input.insertText({ text }); };
  const idle = () => waitFor(`document.getElementById('stop').hidden && !document.body.classList.contains('busy')`, 'the reply to end');
  const last = `[...document.querySelectorAll('#log .msg.assistant')].pop()`;
  const sse = (...events) => events.map((e) => `data: ${JSON.stringify(e)}\n\n`).join('') + 'data: [DONE]\n\n';
  const chunk = (delta, finish = null) => ({ id: 'x', object: 'chat.completion.chunk', created: 1, model: MODEL,
    choices: [{ index: 0, delta, finish_reason: finish }] });
  const usage = (p, c, g) => ({ id: 'x', object: 'chat.completion.chunk', created: 1, model: MODEL, choices: [],
    usage: { prompt_tokens: p, completion_tokens: g, total_tokens: p + g, prompt_tokens_details: { cached_tokens: c } } });

  // ---- the page loads, asks for the key, keeps it for the tab --------------------------------
  await Page.navigate({ url: `${BASE}/` });
  await Page.loadEventFired();
  await waitFor(`document.getElementById('key-dialog').open`, 'the API key dialog');
  await type('#key', KEY);
  await enter();
  await waitFor(`document.getElementById('model').textContent === ${JSON.stringify(MODEL)}`, 'the model id from /v1/models');
  assert.equal(await js(`sessionStorage.getItem('dsflash.key')`), KEY);
  assert.equal(await js(`localStorage.getItem('dsflash.key')`), null, 'the key must not go to localStorage');

  // ---- a message streams into the page; Esc stops it mid-stream -----------------------------
  await js(`document.getElementById('thinking').click()`); // thinking off: the text is the answer
  plan.push('long');
  await type('#input', 'Hello! Tell me a long story.');
  await enter();
  const seen = new Set();
  const t0 = Date.now();
  while (seen.size < 3) { // three growing lengths observed while the reply is still running
    const st = await js(`(() => { const m = ${last}; return { n: m ? m.querySelector('.content').textContent.length : 0,
      busy: !document.getElementById('stop').hidden }; })()`);
    assert.ok(st.busy || seen.size >= 3, `the reply ended before it could be stopped (lengths seen: ${[...seen]})`);
    if (st.n > 0) seen.add(st.n);
    assert.ok(Date.now() - t0 < 30000, 'no streamed text within 30 s');
    await sleep(5);
  }
  await key('Escape', 'Escape', 27);
  await idle();
  const stopped = await js(`${last}.querySelector('.stats').textContent`);
  assert.match(stopped, /^stopped/, 'the reply is marked stopped');
  const n1 = await js(`${last}.querySelector('.content').textContent.length`);
  assert.ok(n1 > 0);
  assert.equal(requests[0].thinking, false);
  assert.equal(requests[0].stream, true);
  assert.deepEqual(requests[0].stream_options, { include_usage: true });
  // the server saw the client go away before its 6000 tokens (the request log's cancel line)
  const tLog = Date.now();
  let cancel;
  while (!(cancel = /^.*POST \/v1\/chat\/completions.* gen (\d+) .*status 499 cancelled.*$/m.exec(fs.readFileSync(LOG, 'utf8')))) {
    assert.ok(Date.now() - tLog < 20000, `no cancelled request in the server log ${LOG}`);
    await sleep(100);
  }
  assert.ok(Number(cancel[1]) < 6000, cancel[0]);
  console.log(`stopped after ${n1} characters: ${cancel[0]}`);
  assert.equal(await js(`${last}.querySelector('.content').textContent.length`), n1, 'text arrived after the stop');

  // ---- thinking on: the reasoning block appears, then collapses; Shift+Enter is a new line ----
  await js(`document.getElementById('thinking').click()`);
  await js(`(() => { const e = document.getElementById('max-tokens'); e.value = '24'; e.dispatchEvent(new Event('change')); })()`);
  await type('#input', 'What is');
  await enter(8); // Shift
  await Input.insertText({ text: '2+2?' });
  assert.equal(await js(`document.getElementById('input').value`), 'What is\n2+2?', 'Shift+Enter adds a new line');
  assert.equal(requests.length, 1, 'Shift+Enter must not send');
  await enter();
  await waitFor(`(() => { const d = ${last}.querySelector('details.reasoning'); return d && d.querySelector('.md').textContent.length > 0; })()`,
    'the reasoning block');
  await idle();
  const r2 = requests[1];
  assert.equal(r2.thinking, true);
  assert.equal(r2.reasoning_effort, 'high');
  assert.equal(r2.max_tokens, 24);
  assert.equal(r2.messages.at(-1).content, 'What is\n2+2?');
  assert.equal(r2.messages.length, 3, 'user, the stopped reply, user');
  const det = `${last}.querySelector('details.reasoning')`;
  assert.equal(await js(`${det}.open`), false, 'the reasoning is collapsed once the reply is done');
  await js(`${det}.querySelector('summary').click()`);
  assert.equal(await js(`${det}.open`), true, 'a click opens it');
  await js(`${det}.querySelector('summary').click()`);
  assert.equal(await js(`${det}.open`), false, 'a second click closes it');
  const fig = await js(`document.getElementById('figures').textContent`);
  assert.match(fig, /prompt \d+ tok · cached \d+ · generated \d+ · [\d.]+ tok\/s · first token [\d.]+ s/, fig);

  // ---- regenerate: the same conversation is sent again ---------------------------------------
  await js(`${last}.querySelector('.regenerate').click()`);
  await idle();
  assert.deepEqual(requests[2].messages, r2.messages, 'regenerate resends the conversation up to the user turn');
  assert.equal(await js(`document.querySelectorAll('#log .msg').length`), 4);

  // ---- a reply with HTML and a javascript: link is shown as text and runs nothing ------------
  const evil = 'Look: <img src=x onerror=alert(1)> and [click me](javascript:alert(2)) and ' +
    '<a href="javascript:alert(3)">link</a> <script>alert(4)</script>\n\n```html\n<b onmouseover=alert(5)>hi</b>\n```';
  plan.push(sse(chunk({ role: 'assistant', reasoning_content: 'Thinking <img src=y onerror=alert(6)>' }),
    chunk({ content: evil }), chunk({}, 'stop'), usage(40, 12, 30)));
  await type('#input', 'Show me some HTML.');
  await enter();
  await idle();
  const x = await js(`(() => { const m = ${last}; const log = document.getElementById('log');
    return { text: m.querySelector('.content').textContent, reasoning: m.querySelector('details.reasoning').textContent,
      imgs: log.querySelectorAll('img').length, scripts: log.querySelectorAll('script').length,
      links: [...log.querySelectorAll('a')].map((a) => a.getAttribute('href')),
      on: [...log.querySelectorAll('*')].flatMap((e) => [...e.attributes].map((a) => a.name)).filter((n) => n.startsWith('on')) }; })()`);
  assert.ok(x.text.includes('<img src=x onerror=alert(1)>'), x.text);
  assert.ok(x.text.includes('[click me](javascript:alert(2))'), x.text);
  assert.ok(x.text.includes('<script>alert(4)</script>'), x.text);
  assert.ok(x.text.includes('<b onmouseover=alert(5)>hi</b>'), x.text);
  assert.ok(x.reasoning.includes('<img src=y onerror=alert(6)>'), x.reasoning);
  assert.equal(x.imgs, 0, 'no <img> element from model text');
  assert.equal(x.scripts, 0);
  assert.deepEqual(x.links, []);
  assert.deepEqual(x.on, []);
  await sleep(200); // an onerror would have fired by now (a data-less <img> fails at once)
  assert.deepEqual(dialogs, [], 'a dialog opened: model text ran script');

  // ---- a tool call: a card with its arguments, a result box that continues ------------------
  plan.push(sse(chunk({ role: 'assistant', tool_calls: [{ index: 0, id: 'call_w1', type: 'function',
    function: { name: 'get_weather', arguments: '' } }] }),
  chunk({ tool_calls: [{ index: 0, function: { arguments: '{"city": ' } }] }),
  chunk({ tool_calls: [{ index: 0, function: { arguments: '"Paris"}' } }] }), chunk({}, 'tool_calls'), usage(50, 40, 9)));
  await type('#input', 'Weather in Paris?');
  await enter();
  await idle();
  const card = await js(`(() => { const c = ${last}.querySelector('.tool-card');
    return c && { name: c.querySelector('.name').textContent, args: c.querySelector('pre').textContent }; })()`);
  assert.ok(card, 'a tool-call card');
  assert.equal(card.name, 'Tool call: get_weather');
  assert.deepEqual(JSON.parse(card.args), { city: 'Paris' });
  plan.push(sse(chunk({ role: 'assistant', content: 'It is **21 °C** in Paris.' }), chunk({}, 'stop'), usage(70, 60, 8)));
  await type(`.tool-card textarea`, '{"temp_c": 21}');
  await js(`document.querySelector('.tool-card .tool-send').click()`);
  await waitFor(`${last}.querySelector('.content').textContent.includes('21 °C')`, 'the reply after the tool result');
  await idle();
  const tr = requests.at(-1).messages;
  assert.deepEqual(tr.at(-2).tool_calls, [{ id: 'call_w1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }]);
  assert.deepEqual(tr.at(-1), { role: 'tool', tool_call_id: 'call_w1', content: '{"temp_c": 21}' });

  // ---- images: the file picker and drag and drop; the request carries data URLs --------------
  assert.equal(await js(`document.getElementById('attach').hidden`), false, 'the image button (vision model)');
  await js(`document.getElementById('new-chat').click()`);
  const { root } = await DOM.getDocument();
  const { nodeId } = await DOM.querySelector({ nodeId: root.nodeId, selector: '#file' });
  await DOM.setFileInputFiles({ nodeId, files: [IMAGE] });
  await waitFor(`document.querySelectorAll('#attachments img').length === 1`, 'the picked image');
  const png = fs.readFileSync(IMAGE).toString('base64');
  await js(`(() => { const b = atob(${JSON.stringify(png)}); const f = new File([Uint8Array.from(b, (c) => c.charCodeAt(0))],
    'dropped.png', { type: 'image/png' }); const dt = new DataTransfer(); dt.items.add(f);
    document.getElementById('log').dispatchEvent(new DragEvent('drop', { dataTransfer: dt, bubbles: true, cancelable: true })); })()`);
  await waitFor(`document.querySelectorAll('#attachments img').length === 2`, 'the dropped image');
  if (!realVision) plan.push(sse(chunk({ role: 'assistant', content: 'Two gradients.' }), chunk({}, 'stop'), usage(60, 0, 3)));
  const nReq = requests.length;
  await type('#input', 'What is in these images?');
  await enter();
  await idle();
  assert.equal(requests.length, nReq + 1);
  const up = requests.at(-1).messages.at(-1);
  assert.equal(up.role, 'user');
  assert.deepEqual(up.content.map((p) => p.type), ['text', 'image_url', 'image_url']);
  for (const p of up.content.slice(1)) assert.equal(p.image_url.url, `data:image/png;base64,${png}`, 'the image bytes, unchanged');
  assert.equal(await js(`document.querySelectorAll('#log .msg.user .imgs img').length`), 2, 'the images are shown');
  if (realVision) { // the server has a projector: the image reached the model (its tokens are in the prompt)
    assert.equal(await js(`${last}.querySelector('.error')`), null, 'the server refused the images');
    const p = Number(/prompt (\d+) tok/.exec(await js(`document.getElementById('figures').textContent`))[1]);
    assert.ok(p >= 2 * 12, `prompt tokens ${p}: the images' tokens are missing`);
  }

  // ---- a showcase reply for the screenshot ----------------------------------------------------
  await js(`document.getElementById('new-chat').click()`);
  plan.push(sse(chunk({ role: 'assistant', reasoning_content: 'The user wants a short function. A loop is enough.' }),
    chunk({ content: 'Here is a **C** function that sums an array:\n\n```c\nfloat sum(const float *x, int n) {\n' +
      '    float s = 0;\n    for (int i = 0; i < n; i++) s += x[i];\n    return s;\n}\n```\n\n' +
      '- `x`: the values\n- `n`: how many\n\nSee https://en.cppreference.com/w/c for more.' }),
    chunk({}, 'stop'), usage(31, 0, 64)));
  await type('#input', 'Write a C function that sums an array.');
  await enter();
  await idle();
  const shot = await Page.captureScreenshot({ format: 'png' });
  fs.mkdirSync(path.dirname(SHOT), { recursive: true });
  fs.writeFileSync(SHOT, Buffer.from(shot.data, 'base64'));

  // ---- a reload restores the conversations from localStorage ---------------------------------
  const before = await js(`document.getElementById('log').textContent`);
  const nChats = await js(`document.querySelectorAll('#chats .chat-item').length`);
  assert.equal(nChats, 3);
  await Page.reload();
  await Page.loadEventFired();
  await waitFor(`document.getElementById('model').textContent === ${JSON.stringify(MODEL)}`, 'the page after the reload');
  assert.equal(await js(`document.getElementById('key-dialog').open`), false, 'the key is kept for the tab');
  assert.equal(await js(`document.getElementById('log').textContent`), before, 'the current chat after the reload');
  assert.equal(await js(`document.querySelectorAll('#chats .chat-item').length`), nChats);
  await js(`[...document.querySelectorAll('#chats .chat-item .open')].pop().click()`); // the oldest chat
  const old = await js(`document.getElementById('log').textContent`);
  assert.ok(old.includes('stopped') && old.includes('Tool call: get_weather') && old.includes('<img src=x onerror=alert(1)>'), old);

  // ---- a phone-sized screen: one column, no sideways scrolling, the menu opens the chats -----
  await Emulation.setDeviceMetricsOverride({ width: 390, height: 844, deviceScaleFactor: 2, mobile: true });
  // the panel slides out (a CSS transition): wait for it, however slow the machine
  await waitFor(`document.getElementById('side').getBoundingClientRect().right <= 0`, 'the side panel to hide', 10000)
    .catch(() => {});
  const ph = await js(`({ sw: document.documentElement.scrollWidth, side: document.getElementById('side').getBoundingClientRect().right,
    menu: getComputedStyle(document.getElementById('menu')).display,
    input: document.getElementById('input').getBoundingClientRect().bottom <= innerHeight })`);
  assert.ok(ph.sw <= 390, `the page is ${ph.sw} px wide on a 390 px screen`);
  assert.ok(ph.side <= 0, 'the side panel is hidden');
  assert.notEqual(ph.menu, 'none');
  assert.ok(ph.input, 'the message box is on screen');
  await js(`document.getElementById('menu').click()`);
  await waitFor(`document.getElementById('side').getBoundingClientRect().left >= 0`, 'the menu to open the side panel', 10000);
  await Emulation.clearDeviceMetricsOverride();

  assert.deepEqual(dialogs, [], 'a dialog opened');
  assert.deepEqual(errors, [], 'console errors');
}
