// markdown.test.mjs: the chat page's Markdown renderer (webui/markdown.js) against XSS payloads,
// run with `node --test` by tests/unit/webui_md.c. The renderer is loaded the way the browser
// loads it (a classic script defining globalThis.dsfMarkdown), in a fresh VM context.
// The checker below is independent of the renderer: it parses the output strictly and accepts
// only the tags and attributes the page is meant to produce, with http(s) link targets.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import vm from 'node:vm';

const src = fs.readFileSync(new URL('../../../webui/markdown.js', import.meta.url), 'utf8');
const ctx = {};
vm.createContext(ctx);
vm.runInContext(src, ctx);
const render = ctx.dsfMarkdown.render;

const TAGS = new Set(['p', 'br', 'strong', 'em', 'del', 'code', 'pre', 'a', 'ul', 'ol', 'li', 'h1', 'h2', 'h3', 'h4',
  'h5', 'h6', 'blockquote', 'hr', 'div', 'span', 'button']);
const ATTRS = { a: ['href', 'rel', 'target'], div: ['class'], span: ['class'], button: ['type', 'class'] };
const CLASSES = new Set(['code', 'code-head', 'lang', 'copy']);

function decode(s) {
  return s.replace(/&(amp|lt|gt|quot|#39);/g, (_, e) => ({ amp: '&', lt: '<', gt: '>', quot: '"', '#39': "'" })[e]);
}

// Every problem in html: a '<' that opens no allowed tag, an attribute not allowed, a link
// that is not http(s), an entity other than the five the renderer writes, a raw '>'.
function problems(html) {
  const out = [];
  const tag = /^<(\/?)([a-z][a-z0-9]*)((?:\s+[a-z]+="[^"<>]*")*)\s*>/;
  let text = '';
  for (let i = 0; i < html.length;) {
    if (html[i] !== '<') {
      if (html[i] === '>') out.push(`raw '>' at ${i}`);
      if (html[i] === '&' && !/^&(amp|lt|gt|quot|#39);/.test(html.slice(i))) out.push(`entity at ${i}: ${html.slice(i, i + 10)}`);
      text += html[i++];
      continue;
    }
    const m = tag.exec(html.slice(i));
    if (!m) { out.push(`stray '<' at ${i}: ${html.slice(i, i + 40)}`); i++; continue; }
    const name = m[2];
    if (!TAGS.has(name)) out.push(`tag <${name}>`);
    for (const a of m[3].matchAll(/([a-z]+)="([^"]*)"/g)) {
      const [, an, av] = a;
      if (m[1] || !(ATTRS[name] || []).includes(an)) out.push(`attribute ${an} on <${m[1]}${name}>`);
      if (an === 'href' && !/^https?:\/\/[^\s]+$/i.test(decode(av))) out.push(`href ${av}`);
      if (an === 'class' && !CLASSES.has(av)) out.push(`class ${av}`);
      if (an === 'type' && av !== 'button') out.push(`type ${av}`);
    }
    i += m[0].length;
  }
  return out;
}

// The text a browser shows (tags dropped, entities decoded).
function shown(html) { return decode(html.replace(/<[^>]*>/g, '')); }

const PAYLOADS = [
  '<img src=x onerror=alert(1)>',
  '<script>alert(1)</script>',
  '<svg/onload=alert(1)>',
  '<a href="javascript:alert(1)">x</a>',
  '[click](javascript:alert(1))',
  '[click](JaVaScRiPt:alert(1))',
  '[click](javascript:alert%281%29)',
  '[click](javascript://%0aalert%281%29)',
  '[click]( javascript:alert(1) )',
  '[click](javascript&#58;alert(1))',
  '[click](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)',
  '[click](vbscript:msgbox(1))',
  '[click](//evil.example/x)',
  '[x](https://ok.example/"onmouseover="alert(1))',
  '[x](https://ok.example/\'onmouseover=\'alert(1))',
  '[x"><img src=x onerror=alert(1)>](https://ok.example/)',
  '[<img src=x onerror=alert(1)>](https://ok.example/)',
  'https://ok.example/"><script>alert(1)</script>',
  'https://ok.example/<img/src=x/onerror=alert(1)>',
  '`<img src=x onerror=alert(1)>`',
  '``<script>`alert(1)`</script>``',
  '```"><img src=x onerror=alert(1)>\ncode\n```',
  '```js" onmouseover="alert(1)\n<script>alert(1)</script>\n```',
  '````\n```\n<script>alert(1)</script>\n```\n````\n<img src=x onerror=alert(1)>',
  '~~~\n<iframe src=javascript:alert(1)>\n',
  '> <img src=x onerror=alert(1)>\n> > <script>alert(1)</script>',
  '- <img src=x onerror=alert(1)>\n  <script>alert(1)</script>\n1. [a](javascript:alert(1))',
  '# <script>alert(1)</script> #',
  '**<img src=x onerror=alert(1)>** _<b>x</b>_ ~~<i>y</i>~~',
  '<<script>script>alert(1)<</script>/script>',
  '&lt;script&gt;alert(1)&lt;/script&gt; &#60;img src=x onerror=alert(1)&#62;',
  '<style>*{background:url(javascript:alert(1))}</style>',
  '<math><mtext><table><mglyph><style><img src=x onerror=alert(1)>',
  '<div style="background:url(javascript:alert(1))">x</div>',
  '<button onclick=alert(1)>Copy</button>',
  '\u0000<img src=x onerror=alert(1)>\u2028<script>alert(1)</script>',
];

test('no payload produces a live tag, attribute or link', () => {
  for (const p of PAYLOADS) assert.deepEqual(problems(render(p)), [], `payload ${JSON.stringify(p)} -> ${render(p)}`);
});

test('raw HTML is shown as text', () => {
  for (const p of ['<img src=x onerror=alert(1)>', '<script>alert(1)</script>', '<a href="javascript:alert(1)">x</a>'])
    assert.ok(shown(render(p)).includes(p), `${JSON.stringify(p)} -> ${render(p)}`);
  const h = render('[click](javascript:alert(1))');
  assert.ok(!/<a\b/.test(h) && shown(h).includes('javascript:alert(1)'), h);
});

test('Markdown is rendered: emphasis, code spans, http(s) links, lists, headings, quotes', () => {
  assert.equal(render('**b** *e* ~~d~~ `c<d`'), '<p><strong>b</strong> <em>e</em> <del>d</del> <code>c&lt;d</code></p>');
  assert.equal(render('[site](https://example.com/a?b=1&c=2)'),
    '<p><a href="https://example.com/a?b=1&amp;c=2" rel="noopener noreferrer nofollow" target="_blank">site</a></p>');
  assert.equal(render('- a\n- b'), '<ul><li>a</li><li>b</li></ul>');
  assert.equal(render('1. a\n2. b'), '<ol><li>a</li><li>b</li></ol>');
  assert.equal(render('## T'), '<h2>T</h2>');
  assert.equal(render('> q'), '<blockquote><p>q</p></blockquote>');
  assert.equal(render('a\nb\n\nc'), '<p>a<br>b</p><p>c</p>');
});

test('code blocks: a copy button, the body verbatim; a longer fence holds a shorter one', () => {
  const h = render('```python\nif a < b:\n    print("x")\n```');
  assert.ok(h.includes('<button type="button" class="copy">Copy</button>'), h);
  assert.ok(h.includes('<span class="lang">python</span>'), h);
  assert.ok(h.includes('<pre><code>if a &lt; b:\n    print(&quot;x&quot;)</code></pre>'), h);
  const n = render('````md\n```\n<script>\n```\n````\nafter');
  assert.equal((n.match(/<pre>/g) || []).length, 1, n);
  assert.ok(n.includes('<code>```\n&lt;script&gt;\n```</code>') && n.endsWith('<p>after</p>'), n);
  // streaming: an unclosed fence is a code block up to the end
  assert.ok(render('```\n<img src=x onerror=alert(1)>').includes('<code>&lt;img src=x onerror=alert(1)&gt;</code>'));
});

test('random mixtures of markup fragments stay inert', () => {
  const parts = ['<', '>', '"', "'", '`', '```', '~~~', '\n', '\n\n', '[', ']', '(', ')', 'javascript:', 'https://a.example/',
    'http://b.example', '*', '**', '_', '#', '> ', '- ', '1. ', ' ', 'onerror=', '=', '&', '&#58;', '&amp;', 'x', '<script>',
    '<img src=x ', '/', '\\', '\t', 'ö', '\u2028'];
  let seed = 12345;
  const rnd = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
  for (let k = 0; k < 3000; k++) {
    let s = '';
    for (let j = rnd(40); j > 0; j--) s += parts[rnd(parts.length)];
    assert.deepEqual(problems(render(s)), [], `input ${JSON.stringify(s)} -> ${render(s)}`);
  }
});
