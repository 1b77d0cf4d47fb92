/* app.js: the dsflash chat page. Plain JavaScript, no framework, no network but this server's
 * own API (/v1/models, /v1/chat/completions; /webui/config.json says whether a key is needed).
 *
 * State: the chats live in localStorage ("dsflash.chats": {id: chat}, "dsflash.current": id),
 * the settings in localStorage ("dsflash.settings"), the API key in sessionStorage
 * ("dsflash.key": this tab only). A chat's messages are OpenAI chat messages; fields that start
 * with "_" are the page's own (figures, stopped, error) and are never sent.
 * Safety: model text reaches the DOM only as textContent or through dsfMarkdown.render, which
 * escapes everything (markdown.js); the server's Content-Security-Policy forbids inline script.
 * Streaming: fetch + ReadableStream, the server-sent events parsed here (parseSse); the view is
 * redrawn at most once per animation frame. */
(function () {
  'use strict';

  var $ = function (id) { return document.getElementById(id); };
  var md = window.dsfMarkdown;
  var LS_CHATS = 'dsflash.chats', LS_CURRENT = 'dsflash.current', LS_SETTINGS = 'dsflash.settings';
  var SS_KEY = 'dsflash.key';

  var chats = {}, current = null;
  var model = null, vision = false, needKey = false;
  var attachments = []; /* data URLs of images waiting to be sent */
  var busy = null;      /* the running generation: {ctrl, msg, el} */

  /* ==== storage ============================================================================ */

  function load(key, fallback) {
    try { var v = JSON.parse(localStorage.getItem(key)); return v == null ? fallback : v; } catch (e) { return fallback; }
  }
  function save() {
    try {
      localStorage.setItem(LS_CHATS, JSON.stringify(chats));
      localStorage.setItem(LS_CURRENT, current || '');
    } catch (e) {
      notice('Could not save the chats in this browser (' + e.name + '): the storage is full. Delete old chats.');
    }
  }
  function saveSettings() {
    var s = { thinking: $('thinking').checked, effort: $('effort').value,
              temperature: $('temperature').value, max_tokens: $('max-tokens').value };
    try { localStorage.setItem(LS_SETTINGS, JSON.stringify(s)); } catch (e) { /* settings are optional */ }
  }
  function loadSettings() {
    var s = load(LS_SETTINGS, {});
    if (typeof s.thinking === 'boolean') $('thinking').checked = s.thinking;
    if (s.effort) $('effort').value = s.effort;
    if (s.temperature != null) $('temperature').value = s.temperature;
    if (s.max_tokens != null) $('max-tokens').value = s.max_tokens;
  }

  function newId() { return Date.now().toString(36) + Math.random().toString(36).slice(2, 8); }
  function chat() {
    if (!current || !chats[current]) {
      current = newId();
      chats[current] = { id: current, title: 'New chat', updated: Date.now(), messages: [] };
    }
    return chats[current];
  }

  function notice(text) {
    var n = $('notice');
    n.textContent = text;
    n.hidden = !text;
  }

  /* ==== API ================================================================================ */

  function headers() {
    var h = { 'Content-Type': 'application/json' };
    var k = sessionStorage.getItem(SS_KEY);
    if (k) h.Authorization = 'Bearer ' + k;
    return h;
  }

  function askKey(message) {
    $('key-error').textContent = message || '';
    $('key-error').hidden = !message;
    var d = $('key-dialog');
    if (!d.open) d.showModal();
    $('key').focus();
  }

  function apiError(status, body) {
    var m = body && body.error && (body.error.message || body.error);
    return 'HTTP ' + status + (m ? ': ' + m : '');
  }

  function loadModels() {
    return fetch('/v1/models', { headers: headers() }).then(function (r) {
      if (r.status === 401) { sessionStorage.removeItem(SS_KEY); askKey('The server refused the key.'); return; }
      return r.json().then(function (j) {
        if (!r.ok) { notice(apiError(r.status, j)); return; }
        var m = j.data && j.data[0];
        if (!m) return;
        model = m.id;
        /* a projector loaded (--mmproj): images can be sent */
        vision = (Array.isArray(m.capabilities) && m.capabilities.indexOf('vision') >= 0) ||
                 !!(m.meta && m.meta.vision);
        $('model').textContent = m.id;
        $('attach').hidden = !vision;
      });
    }).catch(function (e) { notice('Cannot reach the server: ' + e.message); });
  }

  /* Server-sent events: feed() takes decoded text, calls onData(data) per event (data lines
   * joined by "\n"); comments and other fields are skipped. */
  function parseSse(onData) {
    var buf = '', data = [];
    return function feed(text, end) {
      buf += text;
      var lines = buf.split(/\r\n|\r|\n/);
      buf = end ? '' : lines.pop();
      lines.forEach(function (line) {
        if (line === '') { if (data.length) onData(data.join('\n')); data = []; return; }
        if (line[0] === ':') return;
        var c = line.indexOf(':'), field = c < 0 ? line : line.slice(0, c);
        var value = c < 0 ? '' : line.slice(c + 1).replace(/^ /, '');
        if (field === 'data') data.push(value);
      });
      if (end && data.length) onData(data.join('\n'));
    };
  }

  /* The messages as the API takes them: the page's own fields dropped. */
  function wire(messages) {
    return messages.map(function (m) {
      var o = {};
      Object.keys(m).forEach(function (k) { if (k[0] !== '_') o[k] = m[k]; });
      if (o.role === 'assistant' && o.content == null) o.content = '';
      return o;
    });
  }

  function requestBody(messages) {
    var body = { messages: wire(messages), stream: true, stream_options: { include_usage: true },
                 thinking: $('thinking').checked };
    if (model) body.model = model;
    if (body.thinking) body.reasoning_effort = $('effort').value;
    var t = parseFloat($('temperature').value), n = parseInt($('max-tokens').value, 10);
    if (isFinite(t)) body.temperature = t;
    if (n > 0) body.max_tokens = n;
    return body;
  }

  /* One streamed reply appended to the current chat. */
  function generate() {
    if (busy) return;
    var c = chat();
    var msg = { role: 'assistant', content: '', reasoning_content: '' };
    var body = requestBody(c.messages);
    c.messages.push(msg);
    c.updated = Date.now();
    save();
    var ctrl = new AbortController();
    busy = { ctrl: ctrl, msg: msg };
    setBusy(true);
    renderChat();
    var el = $('log').lastElementChild;
    var t0 = performance.now(), tFirst = 0, usage = null, calls = [];
    var frame = 0;
    function redraw() {
      if (frame) return;
      frame = requestAnimationFrame(function () { frame = 0; fillAssistant(el, msg, true); scrollDown(); });
    }
    var feed = parseSse(function (data) {
      if (data === '[DONE]') return;
      var ev;
      try { ev = JSON.parse(data); } catch (e) { msg._error = 'bad event from the server: ' + data.slice(0, 200); return; }
      if (ev.error) { msg._error = ev.error.message || String(ev.error); return; }
      if (ev.usage) usage = ev.usage;
      var ch = ev.choices && ev.choices[0];
      if (!ch) return;
      var d = ch.delta || {};
      if (d.reasoning_content) msg.reasoning_content += d.reasoning_content;
      if (d.content) msg.content += d.content;
      (d.tool_calls || []).forEach(function (tc) {
        var k = tc.index || 0;
        var call = calls[k] || (calls[k] = { id: '', type: 'function', function: { name: '', arguments: '' } });
        if (tc.id) call.id = tc.id;
        if (tc.function && tc.function.name) call.function.name += tc.function.name;
        if (tc.function && tc.function.arguments) call.function.arguments += tc.function.arguments;
      });
      if (calls.length) msg.tool_calls = calls.filter(Boolean);
      if ((d.content || d.reasoning_content || d.tool_calls) && !tFirst) tFirst = performance.now();
      if (ch.finish_reason) msg._finish = ch.finish_reason;
      redraw();
    });
    var decoder = new TextDecoder();
    fetch('/v1/chat/completions', { method: 'POST', headers: headers(), body: JSON.stringify(body),
                                    signal: ctrl.signal })
      .then(function (r) {
        if (!r.ok) {
          return r.text().then(function (t) {
            var j = null;
            try { j = JSON.parse(t); } catch (e) { /* not JSON */ }
            if (r.status === 401) { sessionStorage.removeItem(SS_KEY); askKey('The server refused the key.'); }
            msg._error = apiError(r.status, j || { error: { message: t.slice(0, 300) } });
          });
        }
        var reader = r.body.getReader();
        return (function pump() {
          return reader.read().then(function (x) {
            if (x.done) { feed(decoder.decode(), true); return; }
            feed(decoder.decode(x.value, { stream: true }), false);
            return pump();
          });
        })();
      })
      .catch(function (e) {
        if (e.name === 'AbortError') msg._stopped = true;
        else msg._error = 'the request failed: ' + e.message;
      })
      .then(function () {
        var t1 = performance.now();
        msg._stats = figures(usage, t0, tFirst, t1);
        if (!msg.reasoning_content) delete msg.reasoning_content;
        busy = null;
        setBusy(false);
        c.updated = Date.now();
        save();
        renderChat();
        showFigures(msg._stats);
      });
  }

  function figures(u, t0, tFirst, t1) {
    var s = {};
    if (tFirst) s.ttft = (tFirst - t0) / 1000;
    if (u) {
      s.prompt = u.prompt_tokens;
      s.cached = u.prompt_tokens_details ? u.prompt_tokens_details.cached_tokens : 0;
      s.gen = u.completion_tokens;
      /* a rate over less than 10 ms (a reply that arrived in one piece) says nothing */
      if (tFirst && t1 - tFirst >= 10 && u.completion_tokens > 1) s.tps = (u.completion_tokens - 1) / ((t1 - tFirst) / 1000);
    }
    return s;
  }

  function figuresText(s) {
    if (!s) return '';
    var p = [];
    if (s.prompt != null) p.push('prompt ' + s.prompt + ' tok');
    if (s.cached != null) p.push('cached ' + s.cached);
    if (s.gen != null) p.push('generated ' + s.gen);
    if (s.tps != null) p.push(s.tps.toFixed(1) + ' tok/s');
    if (s.ttft != null) p.push('first token ' + s.ttft.toFixed(2) + ' s');
    return p.join(' · ');
  }
  function showFigures(s) { $('figures').textContent = figuresText(s); }

  function stop() { if (busy) busy.ctrl.abort(); }

  function setBusy(on) {
    $('stop').hidden = !on;
    $('send').disabled = on;
    document.body.classList.toggle('busy', on);
  }

  /* ==== view =============================================================================== */

  function div(cls, text) {
    var d = document.createElement('div');
    if (cls) d.className = cls;
    if (text != null) d.textContent = text;
    return d;
  }
  function button(text, cls, onclick) {
    var b = document.createElement('button');
    b.type = 'button';
    b.textContent = text;
    if (cls) b.className = cls;
    b.addEventListener('click', onclick);
    return b;
  }
  function scrollDown() { var l = $('log'); l.scrollTop = l.scrollHeight; }

  function textOf(content) {
    if (typeof content === 'string') return content;
    return (content || []).filter(function (p) { return p.type === 'text'; }).map(function (p) { return p.text; }).join('\n');
  }
  function imagesOf(content) {
    if (!Array.isArray(content)) return [];
    return content.filter(function (p) { return p.type === 'image_url' && p.image_url; })
      .map(function (p) { return p.image_url.url; })
      .filter(function (u) { return /^data:image\/(png|jpeg);base64,/.test(u); });
  }

  /* The reasoning, the answer, tool-call cards, the figures and the actions of one reply.
   * streaming: the reasoning stays open while it grows and closes when the answer starts. */
  function fillAssistant(el, m, streaming) {
    var body = el.querySelector('.body');
    var det = body.querySelector('details.reasoning');
    if (m.reasoning_content) {
      if (!det) {
        det = document.createElement('details');
        det.className = 'reasoning';
        var sum = document.createElement('summary');
        det.appendChild(sum);
        det.appendChild(div('md'));
        det.open = !!streaming;
        body.insertBefore(det, body.firstChild);
      }
      var answering = !!(m.content || m.tool_calls);
      det.querySelector('summary').textContent = streaming && !answering ? 'Thinking…' : 'Reasoning';
      if (streaming && answering && det.dataset.auto !== 'closed') { det.open = false; det.dataset.auto = 'closed'; }
      det.querySelector('.md').innerHTML = md.render(m.reasoning_content);
    }
    var content = body.querySelector('.content');
    if (!content) { content = div('md content'); body.appendChild(content); }
    content.innerHTML = md.render(m.content || '');
  }

  function toolCards(el, m, idx) {
    var msgs = chat().messages;
    (m.tool_calls || []).forEach(function (tc) {
      var card = div('tool-card');
      card.appendChild(div('name', 'Tool call: ' + (tc.function && tc.function.name)));
      var pre = document.createElement('pre');
      var args = tc.function ? tc.function.arguments : '';
      try { args = JSON.stringify(JSON.parse(args), null, 2); } catch (e) { /* shown as sent */ }
      pre.textContent = args;
      card.appendChild(pre);
      var answered = msgs.slice(idx + 1).some(function (x) { return x.role === 'tool' && x.tool_call_id === tc.id; });
      if (!answered && idx >= lastAssistant(msgs)) {
        var ta = document.createElement('textarea');
        ta.placeholder = 'Paste the tool result, then Send result';
        ta.setAttribute('aria-label', 'Result of ' + (tc.function && tc.function.name));
        card.appendChild(ta);
        card.appendChild(button('Send result', 'tool-send', function () { toolResult(m, tc, ta.value); }));
      }
      el.querySelector('.body').appendChild(card);
    });
  }

  function lastAssistant(msgs) {
    for (var i = msgs.length - 1; i >= 0; i--) if (msgs[i].role === 'assistant') return i;
    return -1;
  }

  /* A tool result: a role "tool" message; when every call of the reply has one, the model goes on. */
  function toolResult(m, tc, text) {
    if (busy) return;
    var c = chat();
    c.messages.push({ role: 'tool', tool_call_id: tc.id, content: text });
    var all = (m.tool_calls || []).every(function (t) {
      return c.messages.some(function (x) { return x.role === 'tool' && x.tool_call_id === t.id; });
    });
    save();
    renderChat();
    if (all) generate();
  }

  function renderMessage(m, i, msgs) {
    var el = div('msg ' + m.role);
    el.appendChild(div('who', m.role === 'user' ? 'You' : m.role === 'tool' ? 'Tool result' : 'Assistant'));
    var body = div('body');
    el.appendChild(body);
    if (m.role === 'assistant') {
      fillAssistant(el, m, false);
      toolCards(el, m, i);
      if (m._error) body.appendChild(div('error', m._error));
      var stats = div('stats', (m._stopped ? 'stopped · ' : '') + figuresText(m._stats));
      el.appendChild(stats);
      if (i === msgs.length - 1 && !busy) {
        var act = div('actions');
        act.appendChild(button('Regenerate', 'regenerate', regenerate));
        act.appendChild(button('Copy', 'copy-msg', function () { copy(m.content || ''); }));
        el.appendChild(act);
      }
    } else {
      body.appendChild(div('text', textOf(m.content)));
      var imgs = imagesOf(m.content);
      if (imgs.length) {
        var box = div('imgs');
        imgs.forEach(function (u) { var im = document.createElement('img'); im.alt = 'attached image'; im.src = u; box.appendChild(im); });
        body.appendChild(box);
      }
    }
    return el;
  }

  function renderChat() {
    var log = $('log');
    log.textContent = '';
    var msgs = chat().messages;
    msgs.forEach(function (m, i) { log.appendChild(renderMessage(m, i, msgs)); });
    renderList();
    scrollDown();
  }

  function renderList() {
    var nav = $('chats');
    nav.textContent = '';
    Object.keys(chats).map(function (k) { return chats[k]; })
      .filter(function (c) { return c.messages.length || c.id === current; })
      .sort(function (a, b) { return b.updated - a.updated; })
      .forEach(function (c) {
        var row = div('chat-item' + (c.id === current ? ' current' : ''));
        var open = button(c.title || 'New chat', 'open', function () { if (!busy) { current = c.id; save(); renderChat(); closeSide(); } });
        open.title = c.title || '';
        row.appendChild(open);
        row.appendChild(button('×', 'del', function () {
          if (busy && c.id === current) return;
          delete chats[c.id];
          if (c.id === current) current = null;
          save();
          renderChat();
        }));
        row.lastChild.setAttribute('aria-label', 'Delete chat ' + (c.title || ''));
        nav.appendChild(row);
      });
  }

  function copy(text) {
    if (navigator.clipboard && navigator.clipboard.writeText)
      navigator.clipboard.writeText(text).then(function () { notice('Copied.'); }, function () { notice('Copy failed.'); });
  }

  /* ==== actions ============================================================================ */

  function send() {
    if (busy) return;
    var text = $('input').value;
    if (!text.trim() && !attachments.length) return;
    var c = chat();
    var content = text;
    if (attachments.length) {
      content = [{ type: 'text', text: text }].concat(attachments.map(function (u) {
        return { type: 'image_url', image_url: { url: u } };
      }));
    }
    c.messages.push({ role: 'user', content: content });
    if (c.title === 'New chat' && text.trim()) c.title = text.trim().slice(0, 60);
    $('input').value = '';
    attachments = [];
    renderAttachments();
    notice('');
    generate();
  }

  function regenerate() {
    var c = chat();
    if (busy || !c.messages.length || c.messages[c.messages.length - 1].role !== 'assistant') return;
    c.messages.pop();
    generate();
  }

  function newChat() {
    if (busy) return;
    current = null;
    chat();
    save();
    renderChat();
    closeSide();
    $('input').focus();
  }

  /* ==== images ============================================================================= */

  function addFiles(files) {
    if (!vision) { notice('This model takes no images (the server has no projector: --mmproj).'); return; }
    Array.prototype.forEach.call(files, function (f) {
      if (!/^image\/(png|jpeg)$/.test(f.type)) { notice(f.name + ': only PNG and JPEG images can be sent.'); return; }
      var rd = new FileReader();
      rd.onload = function () { attachments.push(rd.result); renderAttachments(); };
      rd.onerror = function () { notice(f.name + ': cannot read the file.'); };
      rd.readAsDataURL(f);
    });
  }

  function renderAttachments() {
    var box = $('attachments');
    box.textContent = '';
    attachments.forEach(function (u, i) {
      var a = div('att');
      var im = document.createElement('img');
      im.src = u;
      im.alt = 'image to send';
      a.appendChild(im);
      a.appendChild(button('×', 'remove', function () { attachments.splice(i, 1); renderAttachments(); }));
      a.lastChild.setAttribute('aria-label', 'Remove image');
      box.appendChild(a);
    });
  }

  function closeSide() { $('side').classList.remove('open'); $('menu').setAttribute('aria-expanded', 'false'); }

  /* ==== wiring ============================================================================= */

  function init() {
    loadSettings();
    chats = load(LS_CHATS, {});
    if (typeof chats !== 'object' || Array.isArray(chats)) chats = {};
    current = localStorage.getItem(LS_CURRENT) || null;
    renderChat();

    $('composer').addEventListener('submit', function (e) { e.preventDefault(); send(); });
    $('input').addEventListener('keydown', function (e) {
      if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
    });
    document.addEventListener('keydown', function (e) { if (e.key === 'Escape' && busy) { e.preventDefault(); stop(); } });
    $('stop').addEventListener('click', stop);
    $('new-chat').addEventListener('click', newChat);
    ['thinking', 'effort', 'temperature', 'max-tokens'].forEach(function (id) { $(id).addEventListener('change', saveSettings); });
    $('menu').addEventListener('click', function () {
      var open = $('side').classList.toggle('open');
      $('menu').setAttribute('aria-expanded', open ? 'true' : 'false');
    });
    $('file').addEventListener('change', function () { addFiles($('file').files); $('file').value = ''; });
    /* copy buttons of code blocks (markdown.js writes them; no inline handlers under the CSP) */
    $('log').addEventListener('click', function (e) {
      var b = e.target.closest && e.target.closest('.code .copy');
      if (b) copy(b.closest('.code').querySelector('code').textContent);
    });
    var depth = 0;
    document.addEventListener('dragenter', function (e) { e.preventDefault(); depth++; $('drop').hidden = !vision; });
    document.addEventListener('dragleave', function () { if (--depth <= 0) { depth = 0; $('drop').hidden = true; } });
    document.addEventListener('dragover', function (e) { e.preventDefault(); });
    document.addEventListener('drop', function (e) {
      e.preventDefault();
      depth = 0;
      $('drop').hidden = true;
      if (e.dataTransfer && e.dataTransfer.files.length) addFiles(e.dataTransfer.files);
    });
    $('key-form').addEventListener('submit', function () {
      var k = $('key').value.trim();
      if (k) sessionStorage.setItem(SS_KEY, k);
      $('key').value = '';
      loadModels();
    });
    $('change-key').addEventListener('click', function () { askKey(''); });

    fetch('/webui/config.json').then(function (r) { return r.json(); }).then(function (cfg) {
      needKey = !!cfg.api_key;
      $('change-key').hidden = !needKey;
      if (needKey && !sessionStorage.getItem(SS_KEY)) askKey('');
      else loadModels();
    }).catch(function (e) { notice('Cannot reach the server: ' + e.message); });
    $('input').focus();
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', init);
  else init();
})();
