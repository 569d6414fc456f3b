// What the browser drew, read in the status page after its scripts ran (tests/e2e/test_status_page.py runs it
// through WebDriver): each table cell's box and whether a hit test at its centre lands on it, so a cell clipped by a
// scrolling box or covered by another does not count as visible; each job's headline, cause and chart; and the page's
// width against the window's.
const viewport = document.documentElement.clientWidth;
const box = (el) => { const r = el.getBoundingClientRect(); return {left: r.left, right: r.right, top: r.top, bottom: r.bottom, width: r.width, height: r.height}; };
const seen = (el) => {
  const first = el.getBoundingClientRect();
  window.scrollTo(0, window.scrollY + first.top + first.height / 2 - window.innerHeight / 2);
  const r = el.getBoundingClientRect();
  const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
  return !!hit && (hit === el || el.contains(hit));
};
const cell = (el) => ({text: el.textContent.trim(), label: el.dataset.label ?? null, cls: el.className, ...box(el),
  seen: seen(el), overflow: el.scrollWidth - el.clientWidth, before: getComputedStyle(el, "::before").content});
const tables = [...document.querySelectorAll("div.table")].map((t) => ({
  name: t.dataset.table, stacked: t.classList.contains("stacked"), compact: t.classList.contains("compact"),
  headers: [...t.querySelectorAll("thead th")].map((th) => ({text: th.textContent.trim(), ...box(th), seen: seen(th)})),
  rows: [...t.querySelectorAll("tbody tr")].map((tr) => [...tr.children].map(cell)),
}));
const jobs = [...document.querySelectorAll(".card[data-job]")].map((card) => {
  const figure = card.querySelector(".mfu"), label = card.querySelector(".headline-label");
  const cause = card.querySelector(".cause"), time = cause && cause.querySelector("time.since");
  const svg = card.querySelector("svg.chart");
  const centre = (el) => { const r = el.getBoundingClientRect(); return r.top + r.height / 2; };
  const chart = svg && {
    ...box(svg), scale: Number(svg.dataset.top),
    y: [...svg.querySelectorAll('text[data-axis="y"]')].map((t) => ({text: t.textContent, value: Number(t.dataset.value), at: centre(t), ...box(t)})),
    x: [...svg.querySelectorAll('text[data-axis="x"]')].map((t) => ({text: t.textContent, seconds: Number(t.dataset.seconds), ...box(t)})),
    refs: Object.fromEntries([...svg.querySelectorAll("line[data-ref]")].map((l) => [l.dataset.ref, {value: Number(l.dataset.value), at: centre(l)}])),
    refLabels: [...svg.querySelectorAll("text.ref-label")].map((t) => t.textContent),
    line: box(svg.querySelector("path.line")),
  };
  return {
    job: card.dataset.job, kind: figure.dataset.headline, figure: figure.textContent.trim(),
    size: parseFloat(getComputedStyle(figure).fontSize), label: label.textContent.trim(), labelSeen: seen(label),
    what: card.querySelector(".headline-what").textContent.trim(),
    facts: [...card.querySelectorAll("dd[data-field]")].map((dd) => [dd.dataset.field, dd.textContent.trim()]),
    cause: cause && {cause: cause.dataset.cause, text: cause.textContent.trim(),
      since: time && {text: time.textContent.trim(), datetime: time.getAttribute("datetime"), value: Number(time.dataset.since), seen: seen(time)}},
    chart,
  };
});
window.scrollTo(0, 0);
return {viewport, innerWidth: window.innerWidth, scrollWidth: document.documentElement.scrollWidth, tables, jobs};
