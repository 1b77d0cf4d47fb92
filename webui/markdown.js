/* markdown.js: a small Markdown renderer for model text (dsflash chat page).
 *
 * render(text) -> an HTML string. Safety by construction: every byte of the input is HTML-escaped
 * before it reaches the output, and the only tags in the output are the ones written here
 * (p, br, strong, em, del, code, pre, a, ul, ol, li, h1-h6, blockquote, hr, div, span, button),
 * with the attributes written here (class, href, rel, target, type). A link becomes a tag only
 * when its target starts with http:// or https:// (never javascript:, data:, or a relative
 * path); anything else stays text. Raw HTML in the input is shown as text.
 * Streaming: an unclosed code fence runs to the end of the text (the rest is still coming).
 * Used by app.js in the browser (globalThis.dsfMarkdown) and by the tests under node. */
(function (root) {
  'use strict';

  var ESC = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };
  function esc(s) { return String(s).replace(/[&<>"']/g, function (c) { return ESC[c]; }); }

  /* The URL of a link if it may be one: http(s), no spaces, quotes, angle brackets or controls. */
  function safeUrl(u) {
    return /^https?:\/\/[^\s"'<>`\\\u0000-\u001f\u007f]+$/i.test(u) ? u : null;
  }

  function link(url, textHtml) {
    return '<a href="' + esc(url) + '" rel="noopener noreferrer nofollow" target="_blank">' + textHtml + '</a>';
  }

  /* Emphasis on text that is already escaped: the markers are plain ASCII, never inside a tag. */
  function emphasis(h) {
    return h
      .replace(/\*\*([^*\n]+?)\*\*/g, '<strong>$1</strong>')
      .replace(/__([^_\n]+?)__/g, '<strong>$1</strong>')
      .replace(/~~([^~\n]+?)~~/g, '<del>$1</del>')
      .replace(/(^|[^*\w])\*([^*\s][^*\n]*?)\*(?![*\w])/g, '$1<em>$2</em>')
      .replace(/(^|[^_\w])_([^_\s][^_\n]*?)_(?![_\w])/g, '$1<em>$2</em>');
  }

  /* Plain text with bare http(s) URLs as links. */
  function textRun(s) {
    var out = '', re = /https?:\/\/[^\s<>()"'`\\]+[^\s<>()"'`\\.,;:!?]/gi, last = 0, m;
    while ((m = re.exec(s))) {
      out += emphasis(esc(s.slice(last, m.index)));
      var u = safeUrl(m[0]);
      out += u ? link(u, esc(m[0])) : esc(m[0]);
      last = m.index + m[0].length;
    }
    return out + emphasis(esc(s.slice(last)));
  }

  /* Inline Markdown of one block's raw text: code spans, [text](url) links, bare URLs, emphasis. */
  function inline(s) {
    var out = '', i = 0;
    var re = /(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)|\[([^\[\]\n]{1,500})\]\(\s*([^()\s]{1,2048})\s*\)/g, m;
    while ((m = re.exec(s))) {
      out += textRun(s.slice(i, m.index));
      if (m[1]) {
        out += '<code>' + esc(m[2]) + '</code>';
      } else {
        var u = safeUrl(m[4]);
        out += u ? link(u, emphasis(esc(m[3]))) : esc(m[0]);
      }
      i = m.index + m[0].length;
    }
    return out + textRun(s.slice(i));
  }

  function codeBlock(lang, body) {
    var l = /^[A-Za-z0-9_+.#-]{1,32}$/.test(lang) ? lang : '';
    return '<div class="code"><div class="code-head"><span class="lang">' + esc(l) +
      '</span><button type="button" class="copy">Copy</button></div><pre><code>' + esc(body) + '</code></pre></div>';
  }

  function paragraph(lines) {
    return '<p>' + lines.map(inline).join('<br>') + '</p>';
  }

  var FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)[^`]*$/;
  var LIST = /^ {0,3}([-*+]|\d{1,9}[.)])\s+(.*)$/;

  /* Block structure of lines[i0..i1): fences, headings, rules, quotes, lists, paragraphs. */
  function blocks(lines) {
    var out = [], para = [], i = 0;
    function flush() { if (para.length) { out.push(paragraph(para)); para = []; } }
    while (i < lines.length) {
      var line = lines[i], m;
      if ((m = FENCE.exec(line))) {
        /* closes on the same character, at least as long, nothing else on the line (CommonMark) */
        flush();
        var fence = m[1], body = [], j = i + 1;
        var close = new RegExp('^ {0,3}' + (fence[0] === '`' ? '`' : '~') + '{' + fence.length + ',}\\s*$');
        while (j < lines.length && !close.test(lines[j])) body.push(lines[j++]);
        out.push(codeBlock(m[2], body.join('\n')));
        i = j + 1;
        continue;
      }
      if (/^\s*$/.test(line)) { flush(); i++; continue; }
      if ((m = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/.exec(line))) {
        flush();
        out.push('<h' + m[1].length + '>' + inline(m[2]) + '</h' + m[1].length + '>');
        i++;
        continue;
      }
      if (/^ {0,3}([-*_])(\s*\1){2,}\s*$/.test(line)) { flush(); out.push('<hr>'); i++; continue; }
      if (/^ {0,3}>/.test(line)) {
        flush();
        var q = [];
        while (i < lines.length && /^ {0,3}>/.test(lines[i])) q.push(lines[i++].replace(/^ {0,3}> ?/, ''));
        out.push('<blockquote>' + blocks(q) + '</blockquote>');
        continue;
      }
      if ((m = LIST.exec(line))) {
        flush();
        var ordered = /\d/.test(m[1][0]), items = [];
        while (i < lines.length && (m = LIST.exec(lines[i])) && /\d/.test(m[1][0]) === ordered) {
          var item = [m[2]];
          i++;
          while (i < lines.length && /^\s{2,}\S/.test(lines[i]) && !LIST.exec(lines[i])) item.push(lines[i++].trim());
          items.push('<li>' + item.map(inline).join('<br>') + '</li>');
        }
        out.push((ordered ? '<ol>' : '<ul>') + items.join('') + (ordered ? '</ol>' : '</ul>'));
        continue;
      }
      para.push(line);
      i++;
    }
    flush();
    return out.join('');
  }

  function render(text) {
    return blocks(String(text == null ? '' : text).replace(/\r\n?/g, '\n').split('\n'));
  }

  root.dsfMarkdown = { render: render, escape: esc };
})(typeof globalThis !== 'undefined' ? globalThis : this);
