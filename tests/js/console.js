// Drive the admin console in Debian's headless chromium (playwright-core,
// no downloaded browser) and print what the page shows as one JSON line.
//
//   node console.js <admin base URL> <screenshot dir> <prefix> <dlt topic> [post|execute|read]
//
// The session: the overview (rows of the "diverted" table, held
// partitions, open breakers), the DLT browser (every record of <dlt topic>,
// page by page, each row expanded: decoded value), the replay preview
// (each outcome's line), and then either (post) the two actions posted from
// the page's own context with the page's header (their HTTP statuses), or
// (execute) the previewed replay run with the page's button, or (read)
// nothing more. Screenshots
// of each view go to <screenshot dir>/<prefix>-*.png.
"use strict";

const fs = require("fs");
const os = require("os");
const path = require("path");
const { chromium } = require("playwright-core");

const [base, shots, prefix, dlt, postActions] = process.argv.slice(2);
const ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync"];

async function main() {
  fs.mkdirSync(shots, { recursive: true });
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), "antidote-chromium-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ARGS,
    viewport: { width: 1280, height: 900 },
  });
  const out = { console_errors: [], requests: [] };
  try {
    const page = await context.newPage();
    page.on("console", (m) => { if (m.type() === "error") out.console_errors.push(m.text()); });
    page.on("pageerror", (e) => out.console_errors.push(String(e)));
    page.on("request", (r) => out.requests.push(`${r.method()} ${new URL(r.url()).pathname}`));
    // Nothing but the admin listener may be asked for.
    await context.route("**/*", (route) => {
      const u = new URL(route.request().url());
      if (u.origin === new URL(base).origin) return route.continue();
      out.requests.push("BLOCKED " + u.href);
      return route.abort();
    });

    await page.goto(base + "/console", { waitUntil: "domcontentloaded" });
    await page.waitForFunction(() => document.querySelector("#status").textContent.includes("updated"), null, { timeout: 20000 });
    out.status = await page.textContent("#status");
    out.diverted = await page.$$eval("#diverted tbody tr[data-topic]", (rows) =>
      rows.map((r) => ({ topic: r.dataset.topic, class: r.dataset.class, count: Number(r.dataset.count) })));
    out.legend = await page.$$eval("#legend span", (s) =>
      s.map((x) => ({ topic: x.dataset.topic, class: x.dataset.class, total: Number(x.dataset.total) })));
    out.held = await page.$$eval("#held tbody tr[data-topic]", (rows) =>
      rows.map((r) => ({ topic: r.dataset.topic, partition: Number(r.dataset.partition), reason: r.dataset.reason })));
    out.breakers = await page.$$eval("#breakers tbody tr[data-topic]", (rows) =>
      rows.map((r) => ({ topic: r.dataset.topic, partition: Number(r.dataset.partition) })));
    out.chart_bars = await page.$$eval("#chart rect", (r) => r.length);
    out.blocked_count = Number(await page.textContent("#blocked-count"));
    out.blocked = await page.$$eval("#blocked tbody tr[data-topic]", (rows) =>
      rows.map((r) => ({ topic: r.dataset.topic, partition: Number(r.dataset.partition), key: r.children[2].textContent })));
    await page.screenshot({ path: path.join(shots, `${prefix}-overview.png`), fullPage: true });

    // The DLT browser, a small page size so that paging is exercised.
    await page.click('button[data-tab="browser"]');
    await page.waitForSelector(`#browse-form select[name=topic] option[value="${dlt}"]`, { state: "attached", timeout: 20000 });
    await page.selectOption("#browse-form select[name=topic]", dlt);
    await page.fill("#browse-form input[name=limit]", "3");
    await page.click("#browse-form button[type=submit]");
    out.records = [];
    for (let n = 0; n < 50; n++) {
      await page.waitForFunction(() => !document.querySelector("#browse-info").textContent.startsWith("reading"));
      const rows = await page.$$("#records tbody tr.rec");
      for (const row of rows) {
        await row.click();
        const rec = await row.evaluate((r) => {
          const d = r.nextElementSibling;
          const text = (sel) => (d.querySelector(sel) ? d.querySelector(sel).textContent : null);
          return { coordinate: r.dataset.coordinate, class: r.dataset.class, rule: r.dataset.rule,
            key: r.children[5].textContent, reason: r.children[6].textContent,
            value: text("pre.value"), decoded: text(".decoded + pre, pre.decoded") ?? text("p.decoded"),
            withheld: d.textContent.includes("withheld"), contract_rule: text("p.contract-rule") };
        });
        out.records.push(rec);
      }
      if (n === 0) await page.screenshot({ path: path.join(shots, `${prefix}-browser.png`), fullPage: true });
      if (await page.isDisabled("#next")) break;
      await page.click("#next");
    }
    out.browse_info = await page.textContent("#browse-info");

    // The replay preview.
    await page.click('button[data-tab="replay"]');
    await page.waitForSelector(`#replay-form select[name=topic] option[value="${dlt}"]`, { state: "attached", timeout: 20000 });
    await page.selectOption("#replay-form select[name=topic]", dlt);
    await page.click("#replay-form button[type=submit]");
    await page.waitForFunction(() => !document.querySelector("#replay-summary").textContent.startsWith("previewing"), null, { timeout: 30000 });
    out.preview_summary = await page.textContent("#replay-summary");
    out.execute_visible = await page.isVisible("#execute-button");
    out.preview = await page.$$eval("#outcomes tbody tr[data-kind]", (rows) =>
      rows.map((r) => ({ kind: r.dataset.kind, coordinate: r.dataset.coordinate, line: r.dataset.line,
        verdict: r.children[3].textContent })));
    await page.screenshot({ path: path.join(shots, `${prefix}-replay.png`), fullPage: true });

    // "execute": run the previewed replay with the page's button (its
    // confirmation accepted) and wait for the job to finish.
    if (postActions === "execute") {
      page.on("dialog", (d) => d.accept());
      // The operator types the console token (CONSOLE_TOKEN from the test).
      await page.fill("#token", process.env.CONSOLE_TOKEN || "");
      await page.fill("#rate", "20");
      await page.click("#execute-button");
      await page.waitForFunction(() => document.querySelector("#job").textContent.includes("finished"), null, { timeout: 60000 });
      out.job_text = await page.textContent("#job");
      out.job_outcomes = await page.$$eval("#outcomes tbody tr[data-kind]", (rows) => rows.map((r) => r.dataset.kind));
      await page.screenshot({ path: path.join(shots, `${prefix}-executed.png`), fullPage: true });
    }

    // The actions, posted as the page would post them (not on a console
    // whose actions are on: that would replay for real).
    if (postActions === "post") out.actions = await page.evaluate(async (topic) => {
      const post = (p, body) => fetch(p, { method: "POST", body: JSON.stringify(body),
        headers: { "content-type": "application/json", "x-antidote-console": "1" } })
        .then(async (r) => ({ status: r.status, body: await r.json().catch(() => null) }));
      return {
        execute: await post("/console/api/replay/execute", { topic, rate: 50 }),
        close: await post("/console/api/breaker/close", { topic: "x", partition: 0 }),
      };
    }, dlt);
  } finally {
    await context.close();
    fs.rmSync(profile, { recursive: true, force: true });
  }
  process.stdout.write(JSON.stringify(out) + "\n");
}

main().catch((e) => {
  process.stderr.write(String(e && e.stack || e) + "\n");
  process.exit(1);
});
