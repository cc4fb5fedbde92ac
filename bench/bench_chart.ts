// Draws bench/chart.svg from bench/results.json (written by `deno task
// bench`): one horizontal bar per implementation, grouped by operation, on
// one logarithmic time axis, with each bar's ratio to the C floor of its
// group. Plain SVG with system fonts: no chart library, no network fonts.
//
//   deno run --allow-read --allow-write --allow-run bench/bench_chart.ts \
//     [bench/results.json] [bench/chart.svg]
//   deno run --allow-read bench/bench_chart.ts --markdown [results.json]
//     prints the README's summary table (markdown) instead
import { spawnSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import process from "node:process";

/** The part of results.json the chart reads. */
export interface ChartInput {
  date: string;
  machine: {
    cpu: string;
    cores: number;
    filesystem: string;
    os: string;
    loadavgStart?: number[];
    loadavgEnd?: number[];
  };
  versions: Record<string, string>;
  settings: { rounds: number };
  groups: {
    id: string;
    title: string;
    rows: {
      label: string;
      kind: string;
      runtime: string;
      unit: string;
      best: number;
      median: number;
      ratio?: number;
    }[];
  }[];
}

/** Groups drawn, and which figure of each row is the bar. */
const DRAWN: Record<string, "best" | "median"> = {
  acquire: "best",
  "acquire-tmpfs": "best",
  held: "best",
  inspect: "best",
  free: "best",
  scan: "best",
  handoff: "median",
  startup: "best",
  status: "best",
  run: "best",
};

const COLORS: Record<string, string> = {
  floor: "#3b3b3b",
  bare: "#9a9a9a",
  baseline: "#c4c4c4",
  deno: "#2f6fd0",
  node: "#3f9b3f",
  bun: "#c98a12",
  incumbent: "#c8423b",
};

function color(kind: string, runtime: string): string {
  if (kind in COLORS && kind !== "deno" && kind !== "node" && kind !== "bun") {
    return COLORS[kind];
  }
  return COLORS[runtime] ?? "#777";
}

function escape(text: string): string {
  return text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(
    />/g,
    "&gt;",
  ).replace(/"/g, "&quot;");
}

function formatTime(us: number): string {
  if (us >= 1e6) return `${(us / 1e6).toFixed(us >= 1e7 ? 0 : 1)} s`;
  if (us >= 1e3) return `${(us / 1e3).toFixed(us >= 1e4 ? 0 : 1)} ms`;
  return `${us.toFixed(us >= 100 ? 0 : 1)} µs`;
}

const DECADE_LABELS: Record<number, string> = {
  [-1]: "0.1 µs",
  0: "1 µs",
  1: "10 µs",
  2: "100 µs",
  3: "1 ms",
  4: "10 ms",
  5: "100 ms",
  6: "1 s",
  7: "10 s",
  8: "100 s",
};

export function drawChart(results: ChartInput): string {
  const groups = results.groups.filter((g) => g.id in DRAWN && g.rows.length);
  const value = (g: ChartInput["groups"][number], r: typeof g.rows[number]) =>
    (r[DRAWN[g.id]] ?? r.best) * (r.unit === "ms" ? 1000 : 1);
  const all = groups.flatMap((g) => g.rows.map((r) => value(g, r)))
    .filter((v) => v > 0);
  const lo = Math.floor(Math.log10(Math.min(...all, 1)));
  const hi = Math.ceil(Math.log10(Math.max(...all, 10)));

  const label = (g: ChartInput["groups"][number], text: string) =>
    g.id.endsWith("-tmpfs") ? text.replace(/ \(tmpfs\)$/, "") : text;
  const longest = Math.max(
    ...groups.flatMap((g) => g.rows.map((r) => label(g, r.label).length)),
  );
  const labelW = Math.min(520, Math.max(220, Math.ceil(longest * 6.4) + 16));
  const width = labelW + 640;
  const plotX = labelW + 10;
  const plotW = width - plotX - 150;
  const rowH = 18;
  const x = (us: number) => plotX + ((Math.log10(us) - lo) / (hi - lo)) * plotW;

  const parts: string[] = [];
  let y = 58;
  const legend: [string, string][] = [
    ["C floor (system calls only)", COLORS.floor],
    ["bare Deno.* calls", COLORS.bare],
    ["empty process", COLORS.baseline],
    ["runlock on Deno", COLORS.deno],
    ["runlock on Node", COLORS.node],
    ["runlock on Bun", COLORS.bun],
    ["incumbents", COLORS.incumbent],
  ];
  let lx = 10;
  for (const [name, c] of legend) {
    parts.push(
      `<rect x="${lx}" y="${y - 10}" width="12" height="12" fill="${c}"/>`,
      `<text x="${lx + 16}" y="${y}" class="small">${escape(name)}</text>`,
    );
    lx += 16 + name.length * 6.4 + 18;
  }
  y += 22;
  const top = y;
  const body: string[] = [];
  for (const g of groups) {
    const how = DRAWN[g.id] === "median" ? "median" : "best";
    body.push(
      `<text x="10" y="${y + 14}" class="group">${
        escape(g.title)
      } (${how})</text>`,
    );
    y += 22;
    for (const r of g.rows) {
      const v = value(g, r);
      const end = Math.max(x(v), plotX + 1);
      const ratio = r.ratio !== undefined && r.kind !== "floor"
        ? ` · ${r.ratio.toFixed(2)}×`
        : "";
      body.push(
        `<text x="${labelW}" y="${y + 13}" text-anchor="end">${
          escape(label(g, r.label))
        }</text>`,
        `<rect x="${plotX}" y="${y + 3}" width="${
          (end - plotX).toFixed(1)
        }" height="${rowH - 5}" fill="${color(r.kind, r.runtime)}"/>`,
        `<text x="${(end + 5).toFixed(1)}" y="${y + 13}" class="small">${
          escape(formatTime(v) + ratio)
        }</text>`,
      );
      y += rowH;
    }
    y += 8;
  }
  const bottom = y;
  for (let d = lo; d <= hi; d++) {
    const gx = x(10 ** d).toFixed(1);
    parts.push(
      `<line x1="${gx}" y1="${top}" x2="${gx}" y2="${bottom}" class="grid"/>`,
      `<text x="${gx}" y="${bottom + 16}" text-anchor="middle" class="small">${
        DECADE_LABELS[d] ?? `1e${d} µs`
      }</text>`,
    );
  }
  const height = bottom + 56;
  const m = results.machine;
  const v = results.versions;
  const title = `runlock benchmark, ${results.date.slice(0, 10)}`;
  const sub = `${m.cpu}, ${m.cores} cores, ${m.os}, ${m.filesystem}; deno ${
    v.deno ?? "?"
  }, node ${v.node ?? "?"}, bun ${v.bun ?? "-"}`;
  const load = m.loadavgStart && m.loadavgEnd
    ? `; load average ${m.loadavgStart[0]} at start, ${m.loadavgEnd[0]} at end`
    : "";
  const foot =
    `log scale, shorter is better; best of ${results.settings.rounds} interleaved rounds; ratios against the C floor of the same run; ${
      v.source ?? ""
    }${load}`;
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="system-ui, -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif" font-size="12">`,
    `<style>.small{font-size:11px;fill:#333}.group{font-weight:600;font-size:13px}.grid{stroke:#ddd;stroke-width:1}text{fill:#111}</style>`,
    `<rect width="100%" height="100%" fill="#fff"/>`,
    `<text x="10" y="22" style="font-size:16px;font-weight:600">${
      escape(title)
    }</text>`,
    `<text x="10" y="40" class="small">${escape(sub)}</text>`,
    ...parts,
    ...body,
    `<text x="10" y="${height - 12}" class="small">${escape(foot)}</text>`,
    `</svg>`,
    "",
  ].join("\n");
}

function cell(value: number, unit: string): string {
  const us = unit === "ms" ? value * 1000 : value;
  return formatTime(us);
}

/** A markdown summary of results.json, for the README. */
export function markdownTable(results: ChartInput): string {
  const lines = [
    "| operation | implementation | time | × C floor |",
    "| --- | --- | ---: | ---: |",
  ];
  for (const g of results.groups) {
    if (!(g.id in DRAWN)) continue;
    for (const r of g.rows) {
      const v = DRAWN[g.id] === "median" ? r.median : r.best;
      lines.push(
        `| ${g.title.replace(/\|/g, "\\|")} | ${r.label} | ${
          cell(v, r.unit)
        } | ${
          r.ratio !== undefined && r.kind !== "floor"
            ? `${r.ratio.toFixed(2)}×`
            : ""
        } |`,
      );
    }
  }
  return lines.join("\n");
}

/**
 * `deno fmt` the written files, so that the repo's `deno fmt --check` (which
 * formats SVG and JSON too) passes on them. Best effort.
 */
export function formatFiles(paths: string[]): void {
  spawnSync(Deno.execPath(), ["fmt", "--quiet", ...paths], { stdio: "ignore" });
}

if (import.meta.main) {
  const dir = join(new URL(".", import.meta.url).pathname, "..", "bench");
  const args = process.argv.slice(2);
  if (args[0] === "--markdown") {
    const input = args[1] ?? join(dir, "results.json");
    console.log(markdownTable(JSON.parse(readFileSync(input, "utf8"))));
  } else {
    const [input = join(dir, "results.json"), output = join(dir, "chart.svg")] =
      args;
    writeFileSync(output, drawChart(JSON.parse(readFileSync(input, "utf8"))));
    formatFiles([output]);
    console.log(`wrote ${output}`);
  }
}
