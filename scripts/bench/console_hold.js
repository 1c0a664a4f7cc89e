// Hold the admin console's overview open in Debian's headless chromium for
// N seconds (it refreshes itself every 5 s), for scripts/bench/console_cpu.py.
//   NODE_PATH=tests/js/node_modules node scripts/bench/console_hold.js <admin URL> <seconds>
// Prints {"overview_requests": n} when done.
"use strict";
const fs = require("fs");
const os = require("os");
const path = require("path");
const { chromium } = require("playwright-core");

(async () => {
  const [base, seconds] = process.argv.slice(2);
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), "antidote-bench-chromium-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  let n = 0;
  const page = await context.newPage();
  page.on("request", (r) => { if (r.url().endsWith("/console/api/overview")) n++; });
  await page.goto(base + "/console");
  await page.waitForTimeout(Number(seconds) * 1000);
  await context.close();
  fs.rmSync(profile, { recursive: true, force: true });
  process.stdout.write(JSON.stringify({ overview_requests: n }) + "\n");
})().catch((e) => { process.stderr.write(String(e.stack || e) + "\n"); process.exit(1); });
