// `deno task build:npm`: builds the npm package into npm/ (ignored by git),
// doing what dnt would. `deno task pack` (--pack) then packs it into
// npm/runlock-<version>.tgz, the tarball the README installs from a clone.
//
//   npm/package/        the package: esm/ (.js + .d.ts), cjs/ (.cjs +
//                       .d.cts), package.json, README.md, LICENSE
//   npm/tests/          the same test files, compiled to JavaScript, for
//                       Node and Bun (scripts/test_npm.ts runs them)
//
// The runtime-specific file is swapped here: src/platform/current.ts (which
// exports the Deno platform) is replaced by current.node.ts (koffi flock), so
// no Deno code ships to npm, and deno.json's publish list keeps the Node
// files out of JSR.
import {
  chmodSync,
  copyFileSync,
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { dirname, join, relative } from "node:path";
import process from "node:process";
import { spawnSync } from "node:child_process";
import ts from "typescript";

const ESBUILD = "0.25.12";

const root = join(dirname(new URL(import.meta.url).pathname), "..");
const out = join(root, "npm");
const pkgDir = join(out, "package");
const stage = join(out, ".stage");
const config = JSON.parse(readFileSync(join(root, "deno.json"), "utf8"));
const koffiVersion = config.imports.koffi.replace(/^npm:koffi@/, "");

function walk(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    return statSync(path).isDirectory() ? walk(path) : [path];
  });
}

function write(path: string, text: string): void {
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, text);
}

function fail(diagnostics: readonly ts.Diagnostic[]): void {
  if (diagnostics.length === 0) return;
  console.error(ts.formatDiagnosticsWithColorAndContext(diagnostics, {
    getCanonicalFileName: (f) => f,
    getCurrentDirectory: () => root,
    getNewLine: () => "\n",
  }));
  process.exit(1);
}

rmSync(out, { recursive: true, force: true });

// 1. Stage the sources with the Node platform swapped in.
const SKIP = new Set(["src/platform/deno.ts", "src/platform/current.node.ts"]);
const sources = [
  "mod.ts",
  ...walk(join(root, "src")).map((f) => relative(root, f)),
]
  .filter((f) => f.endsWith(".ts") && !f.endsWith("_test.ts") && !SKIP.has(f));
for (const file of sources) {
  const from = file === "src/platform/current.ts"
    ? "src/platform/current.node.ts"
    : file;
  write(join(stage, file), readFileSync(join(root, from), "utf8"));
}

// 2. Compile: tsc for the declarations (with their JSDoc) and the ES module
// tree, then esbuild bundles that tree into one ES module and one CommonJS
// file. One file instead of nine cuts Node's import cost about fourfold
// (measured: ~18 ms to ~5 ms), which CLIs feel on every start.
const tscOut = join(out, ".tsc");
const program = ts.createProgram(sources.map((f) => join(stage, f)), {
  target: ts.ScriptTarget.ES2022,
  module: ts.ModuleKind.ES2022,
  moduleResolution: ts.ModuleResolutionKind.Bundler,
  lib: ["lib.es2022.d.ts", "lib.esnext.disposable.d.ts"],
  declaration: true,
  rewriteRelativeImportExtensions: true,
  // Types were checked by `deno check` on the sources; the Node build only
  // needs emit, so it does not need @types/node.
  noCheck: true,
  skipLibCheck: true,
  types: [],
  strict: true,
  rootDir: stage,
  outDir: tscOut,
});
fail(
  program.emit().diagnostics.filter((d) =>
    d.category === ts.DiagnosticCategory.Error
  ),
);

// Ship only the declarations that the entry points (mod.d.ts and, for
// "runlock/cli", src/cli.d.ts) reach, not the internals'.
const reached = new Set<string>();
const queue = [join(tscOut, "mod.d.ts"), join(tscOut, "src", "cli.d.ts")];
while (queue.length > 0) {
  const file = queue.pop()!;
  if (reached.has(file)) continue;
  reached.add(file);
  for (
    const [, spec] of readFileSync(file, "utf8").matchAll(
      /from ["'](\.{1,2}\/[^"']+)\.ts["']/g,
    )
  ) {
    queue.push(join(dirname(file), `${spec}.d.ts`));
  }
}
for (const file of walk(tscOut)) {
  if (file.endsWith(".d.ts") && !reached.has(file)) rmSync(file);
}

// Declarations: esm/*.d.ts and, for require, the same as cjs/*.d.cts. Their
// specifiers point at the sources' .ts files: point them at .js/.cjs.
// Examples in the docs import the JSR name; on npm the package is "runlock".
for (const file of walk(tscOut).filter((f) => f.endsWith(".d.ts"))) {
  const rel = relative(tscOut, file);
  const text = readFileSync(file, "utf8")
    .replaceAll('from "@runlock/runlock"', 'from "runlock"')
    .replaceAll('from "@runlock/runlock/cli"', 'from "runlock/cli"');
  const spec = /(from ["']\.{1,2}\/[^"']*)\.ts(["'])/g;
  write(join(pkgDir, "esm", rel), text.replace(spec, "$1.js$2"));
  write(
    join(pkgDir, "cjs", rel.replace(/\.d\.ts$/, ".d.cts")),
    text.replace(spec, "$1.cjs$2"),
  );
}

function bundle(
  format: "esm" | "cjs",
  entry: string,
  outfile: string,
  extra: string[] = [],
): void {
  const args = [
    "--yes",
    `esbuild@${ESBUILD}`,
    entry,
    "--bundle",
    "--platform=node",
    "--target=node20",
    `--format=${format}`,
    "--external:koffi",
    "--external:bun:ffi",
    "--log-level=warning",
    `--outfile=${outfile}`,
    ...extra,
  ];
  if (format === "cjs") {
    // The lazy FFI loader resolves from this file's location.
    args.push(
      "--define:import.meta.url=__runlock_url",
      `--banner:js=const __runlock_url = require("node:url").pathToFileURL(__filename).href;`,
    );
  }
  const result = spawnSync("npx", args, { stdio: "inherit" });
  if (result.status !== 0) throw new Error(`esbuild failed (${format})`);
}
bundle("esm", join(tscOut, "mod.js"), join(pkgDir, "esm", "mod.js"));
bundle("cjs", join(tscOut, "mod.js"), join(pkgDir, "cjs", "mod.cjs"));

// "runlock/cli": main() and CliIo, for programs that run the command line
// in-process. It imports the library through the package's own name
// (external), so that a program importing both "runlock" and "runlock/cli"
// has one copy of the library and its per-process state.
const cliSource = join(tscOut, "src", "cli.js");
write(
  join(tscOut, "src", "cli.lib.js"),
  readFileSync(cliSource, "utf8").replace(
    /from ["']\.\.\/mod\.js["']/,
    'from "runlock"',
  ),
);
for (const [format, file] of [["esm", "cli.js"], ["cjs", "cli.cjs"]] as const) {
  bundle(
    format,
    join(tscOut, "src", "cli.lib.js"),
    join(pkgDir, format, file),
    [
      "--external:runlock",
      // cli.ts runs main itself when it is the entry module; a library never
      // is.
      "--define:import.meta.main=false",
    ],
  );
}

// The `runlock` bin: the CLI and the library in one ES module file.
write(
  join(tscOut, "bin.js"),
  `import process from "node:process";\n` +
    `import { main } from "./src/cli.js";\n` +
    `process.exitCode = await main(process.argv.slice(2));\n`,
);
bundle("esm", join(tscOut, "bin.js"), join(pkgDir, "bin", "runlock.js"), [
  "--banner:js=#!/usr/bin/env node",
  // cli.ts runs main itself when it is the entry module (Deno, Bun); here
  // bin.js does, so the bundle must not run it twice.
  "--define:import.meta.main=false",
]);
chmodSync(join(pkgDir, "bin", "runlock.js"), 0o755);

for (
  const file of [
    "esm/mod.js",
    "cjs/mod.cjs",
    "esm/cli.js",
    "cjs/cli.cjs",
    "bin/runlock.js",
  ]
) {
  const code = readFileSync(join(pkgDir, file), "utf8")
    .replace(/\/\*[\s\S]*?\*\//g, "")
    .replace(/^\s*\/\/.*$/gm, "");
  if (/\bDeno\./.test(code)) {
    throw new Error(`${file} mentions Deno: the platform swap failed`);
  }
}
rmSync(stage, { recursive: true, force: true });
rmSync(tscOut, { recursive: true, force: true });

// 3. package.json, README, LICENSE.
const pkg = {
  name: "runlock",
  version: config.version,
  description:
    "One orchestrator per state directory, and everyone can see who: a PID lockfile and a flock(2) run-liveness lock in one file, interoperable across Deno, Node.js and Bun.",
  license: config.license,
  keywords: [
    "lock",
    "lockfile",
    "pidfile",
    "flock",
    "mutex",
    "singleton",
    "cli",
  ],
  type: "module",
  main: "./cjs/mod.cjs",
  module: "./esm/mod.js",
  types: "./cjs/mod.d.cts",
  exports: {
    ".": {
      import: { types: "./esm/mod.d.ts", default: "./esm/mod.js" },
      require: { types: "./cjs/mod.d.cts", default: "./cjs/mod.cjs" },
    },
    "./cli": {
      import: { types: "./esm/src/cli.d.ts", default: "./esm/cli.js" },
      require: { types: "./cjs/src/cli.d.cts", default: "./cjs/cli.cjs" },
    },
    "./package.json": "./package.json",
  },
  bin: { runlock: "bin/runlock.js" },
  files: [
    "esm/",
    "cjs/",
    "cli/",
    "bin/",
    "README.md",
    "LICENSE",
    "PROTOCOL.md",
  ],
  sideEffects: false,
  engines: { node: ">=20" },
  os: ["linux", "darwin", "freebsd", "openbsd", "netbsd"],
  dependencies: { koffi: koffiVersion },
};
write(join(pkgDir, "package.json"), JSON.stringify(pkg, null, 2) + "\n");
// For resolvers that predate "exports" (TypeScript's moduleResolution
// "node10", old bundlers): "runlock/cli" is then the directory cli/.
write(
  join(pkgDir, "cli", "package.json"),
  JSON.stringify(
    {
      private: true,
      main: "../cjs/cli.cjs",
      types: "../cjs/src/cli.d.cts",
    },
    null,
    2,
  ) + "\n",
);
for (const file of ["README.md", "LICENSE", "PROTOCOL.md"]) {
  copyFileSync(join(root, file), join(pkgDir, file));
}

// 4. The test suite, compiled for Node and Bun. Tests import the library
// through ./_entry.js, which scripts/test_npm.ts points at the package's ESM
// or CommonJS entry; everything else is the same file.
const allTestFiles = walk(join(root, "tests")).filter((f) => f.endsWith(".ts"));
// The PostgreSQL backend (src/postgres/) is not in the npm package yet: its
// tests, and the files that import them, stay Deno-only until it is.
const notShipped = /(["'])(?:\.\.\/)+src\/postgres\//;
const denoOnly = new Set(
  allTestFiles.filter((f) => notShipped.test(readFileSync(f, "utf8"))),
);
for (let grew = true; grew;) {
  grew = false;
  for (const file of allTestFiles) {
    if (denoOnly.has(file)) continue;
    const imports = [
      ...readFileSync(file, "utf8").matchAll(/from ["'](\.{1,2}\/[^"']+)["']/g),
    ].map(([, spec]) => join(dirname(file), spec));
    if (imports.some((f) => denoOnly.has(f))) {
      denoOnly.add(file);
      grew = true;
    }
  }
}
if (denoOnly.size > 0) {
  console.log(
    `not compiled for npm (they import src/postgres/, not shipped on npm yet): ${
      [...denoOnly].map((f) => relative(root, f)).join(", ")
    }`,
  );
}
const testFiles = allTestFiles.filter((f) => !denoOnly.has(f));
for (const file of testFiles) {
  const rel = relative(join(root, "tests"), file);
  const up = rel.includes("/") ? "../" : "./";
  const source = readFileSync(file, "utf8")
    .replace(
      /(["'])(?:\.\.\/)+mod\.ts\1/g,
      (_m, q) => `${q}${up}_entry.js${q}`,
    )
    .replace(
      /(["'])@runlock\/runlock\/cli\1/g,
      (_m, q) => `${q}${up}_cli_entry.js${q}`,
    );
  if (/(["'])(?:\.\.\/)+src\//.test(source)) {
    throw new Error(
      `${rel} imports src/ directly: tests must use the public API`,
    );
  }
  const { outputText, diagnostics } = ts.transpileModule(source, {
    fileName: file,
    reportDiagnostics: true,
    compilerOptions: {
      target: ts.ScriptTarget.ES2022,
      module: ts.ModuleKind.ES2022,
      rewriteRelativeImportExtensions: true,
      verbatimModuleSyntax: false,
    },
  });
  fail(diagnostics ?? []);
  write(join(out, "tests", rel.replace(/\.ts$/, ".js")), outputText);
}
const names = Object.keys(await import("../mod.ts")).sort();
write(
  join(out, "tests", "_entry.esm.js"),
  `export * from "runlock";\n`,
);
write(
  join(out, "tests", "_entry.cjs.js"),
  `import { createRequire } from "node:module";\n` +
    `const runlock = createRequire(import.meta.url)("runlock");\n` +
    `export const { ${names.join(", ")} } = runlock;\n`,
);
write(
  join(out, "tests", "_cli_entry.esm.js"),
  `export * from "runlock/cli";\n`,
);
write(
  join(out, "tests", "_cli_entry.cjs.js"),
  `import { createRequire } from "node:module";\n` +
    `export const { main } = createRequire(import.meta.url)("runlock/cli");\n`,
);
write(join(out, "tests", "package.json"), `{ "type": "module" }\n`);
// Fixtures that are not TypeScript (the Python ones) go as they are.
for (const file of walk(join(root, "tests", "fixtures"))) {
  if (file.endsWith(".ts")) continue;
  const to = join(out, "tests", relative(join(root, "tests"), file));
  mkdirSync(dirname(to), { recursive: true });
  copyFileSync(file, to);
}

console.log(
  `built ${pkg.name}@${pkg.version} in ${relative(root, pkgDir)}/ ` +
    `(${sources.length} modules, ESM + CommonJS) and ${testFiles.length} test files in npm/tests/`,
);
if (!existsSync(join(pkgDir, "cjs", "mod.cjs"))) {
  throw new Error("no CommonJS entry");
}

if (process.argv.includes("--pack")) {
  for (const f of readdirSync(out).filter((f) => f.endsWith(".tgz"))) {
    rmSync(join(out, f));
  }
  const packed = spawnSync(
    "npm",
    ["pack", "--silent", "--pack-destination", out],
    { cwd: pkgDir, encoding: "utf8" },
  );
  if (packed.status !== 0) throw new Error(`npm pack failed: ${packed.stderr}`);
  console.log(`packed ${relative(root, join(out, packed.stdout.trim()))}`);
}
