// `deno task build:npm`: builds the npm package into npm/ (ignored by git),
// doing what dnt would. `deno task pack` (--pack) then packs it into
// npm/runlock-<version>.tgz, the tarball the README installs from a clone.
//
//   npm/package/        the package: esm/ (.js + .d.ts), cjs/ (.cjs +
//                       .d.cts), package.json, README.md, LICENSE
//   npm/tests/          the same test files, compiled to JavaScript, for
//                       Node and Bun (scripts/test_npm.ts runs them)
//
// Entry points: "runlock" (mod.ts), "runlock/cli" (src/cli.ts) and
// "runlock/postgres" (src/postgres/mod.ts), plus the `runlock` bin. The
// PostgreSQL client `pg` is a dependency of the package, left external in
// every bundle and loaded by the first database connection only.
//
// The runtime-specific file is swapped here: src/platform/current.ts (which
// exports the Deno platform) is replaced by current.node.ts (koffi flock), so
// no Deno code ships to npm, and deno.json's publish list keeps the Node
// files out of JSR.
import {
  chmodSync,
  copyFileSync,
  cpSync,
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
import ts from "npm:typescript@5.9.3";
import { NPM_PINS } from "./_pins.ts";

const ESBUILD = "0.25.12";

const root = join(dirname(new URL(import.meta.url).pathname), "..");
const out = join(root, "npm");
const pkgDir = join(out, "package");
const stage = join(out, ".stage");
const config = JSON.parse(readFileSync(join(root, "deno.json"), "utf8"));
/** The exact version scripts/_pins.ts pins for the npm package `name`. */
function pinned(name: string): string {
  const version = NPM_PINS[name];
  if (version === undefined) {
    throw new Error(`scripts/_pins.ts pins no version of ${name}`);
  }
  return version;
}
// The package's runtime dependency, pinned as scripts/_pins.ts pins it, and its
// optional peer: pg (node-postgres), which only "runlock/postgres" and
// `runlock --db` load, on their first connection; without it they say
// what to install (src/postgres/_session.ts).
const dependencies = { koffi: pinned("koffi") };
const peerDependencies = { pg: `^${pinned("pg")}` };
const imported = { ...dependencies, ...peerDependencies };

/**
 * `npm:name@version` specifiers (Deno's; the sources name them in full, as
 * src/postgres/_session.ts does with npm:pg@8.23.1) as the bare names Node,
 * Bun and esbuild resolve from the package's dependencies. An npm:
 * specifier of anything else is an error: the package would not install
 * it. The tests may also use `devOnly` packages, which scripts/test_npm.ts
 * installs beside the package.
 */
function bareNpmSpecifiers(
  text: string,
  file: string,
  devOnly: string[] = [],
): string {
  return text.replace(
    /(["'])npm:((?:@[^/"']+\/)?[^@/"']+)@([^"']*)\1/g,
    (_m, q, name: string, version: string) => {
      if (!(name in imported) && !devOnly.includes(name)) {
        throw new Error(
          `${file} imports npm:${name}, which is not a dependency of the npm package`,
        );
      }
      if (version !== pinned(name)) {
        throw new Error(
          `${file} imports npm:${name}@${version}; scripts/_pins.ts pins ${
            pinned(name)
          }`,
        );
      }
      return `${q}${name}${q}`;
    },
  );
}

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
// Deno's platform (deno.ts and every _*_deno.ts) is Deno's alone.
const denoOnly = (f: string) =>
  f === "src/platform/deno.ts" || /^src\/platform\/_\w+_deno\.ts$/.test(f);
const SKIP = new Set(["src/platform/current.node.ts"]);
const sources = [
  "mod.ts",
  ...walk(join(root, "src")).map((f) => relative(root, f)),
]
  .filter((f) =>
    f.endsWith(".ts") && !f.endsWith("_test.ts") && !SKIP.has(f) &&
    !denoOnly(f)
  );
for (const file of sources) {
  const from = file === "src/platform/current.ts"
    ? "src/platform/current.node.ts"
    : file;
  write(
    join(stage, file),
    bareNpmSpecifiers(readFileSync(join(root, from), "utf8"), file),
  );
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
// "runlock/cli" and "runlock/postgres", src/cli.d.ts and
// src/postgres/mod.d.ts) reach, not the internals'.
const reached = new Set<string>();
const queue = [
  join(tscOut, "mod.d.ts"),
  join(tscOut, "src", "cli.d.ts"),
  join(tscOut, "src", "postgres", "mod.d.ts"),
];
while (queue.length > 0) {
  const file = queue.pop()!;
  if (reached.has(file)) continue;
  reached.add(file);
  // Code only: the JSDoc examples import the JSR names and node: modules.
  const text = readFileSync(file, "utf8").replace(/\/\*[\s\S]*?\*\//g, "");
  for (
    const [, spec] of text.matchAll(
      /(?:from |import\()["']([^"']+)["']/g,
    )
  ) {
    if (/^\.{1,2}\//.test(spec)) {
      queue.push(join(dirname(file), spec.replace(/\.ts$/, ".d.ts")));
    } else if (!spec.startsWith("node:")) {
      // A user's type check must not need the database client's types (pg
      // ships none) or anything else the package does not declare.
      throw new Error(
        `${
          relative(tscOut, file)
        } refers to "${spec}": declarations may import only the package's own files and node: modules`,
      );
    }
  }
}
for (const file of walk(tscOut)) {
  if (file.endsWith(".d.ts") && !reached.has(file)) rmSync(file);
}

// Declarations: esm/*.d.ts and, for require, the same as cjs/*.d.cts. Their
// specifiers point at the sources' .ts files: point them at .js/.cjs.
// Examples in the docs import the JSR name ("@runlock/runlock",
// "@runlock/runlock/cli", "@runlock/runlock/postgres"); on npm the package
// is "runlock".
for (const file of walk(tscOut).filter((f) => f.endsWith(".d.ts"))) {
  const rel = relative(tscOut, file);
  const text = readFileSync(file, "utf8")
    .replace(
      /(from ["'])@runlock\/runlock((?:\/[a-z]+)?["'])/g,
      "$1runlock$2",
    );
  if (/["']@runlock\/runlock/.test(text)) {
    throw new Error(`${rel} still imports the JSR package's name`);
  }
  const spec = /((?:from |import\()["']\.{1,2}\/[^"']*)\.ts(["'])/g;
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
    // The PostgreSQL client: an optional peer of the package, imported by
    // src/postgres/ on its first connection only (`import("pg")`), so that
    // file-lock users and `runlock` without --db never load it.
    "--external:pg",
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

// "runlock/postgres": pgLocks and its errors. The error classes it
// re-exports (HeldError, LockLostError, ...) must be runlock's own, not a
// second copy, or `err instanceof HeldError` fails for a program that
// imports HeldError from "runlock" and locks through "runlock/postgres"
// (tests/contract_test.ts checks it). So the bundle takes them
// from the package's own name, left external: in a copy of the compiled
// tree, every import of src/errors.js, whoever makes it, becomes "runlock".
const errorsModule = join(tscOut, "src", "errors.js");
const errorNames = new Set(Object.keys(await import("../src/errors.ts")));
const libraryNames = new Set(Object.keys(await import("../mod.ts")));
for (const name of errorNames) {
  if (!libraryNames.has(name)) {
    throw new Error(
      `src/errors.ts exports ${name} but mod.ts does not: "runlock/postgres" takes the errors from "runlock"`,
    );
  }
}
const pgTree = join(out, ".tsc-postgres");
for (const file of walk(tscOut).filter((f) => f.endsWith(".js"))) {
  const text = readFileSync(file, "utf8").replace(
    /((?:from |import\()["'])(\.{1,2}\/[^"']+)(["'])/g,
    (m, before, spec, after) =>
      join(dirname(file), spec) === errorsModule
        ? `${before}runlock${after}`
        : m,
  );
  write(join(pgTree, relative(tscOut, file)), text);
}
for (
  const [format, file] of [
    ["esm", "postgres.js"],
    ["cjs", "postgres.cjs"],
  ] as const
) {
  bundle(
    format,
    join(pgTree, "src", "postgres", "mod.js"),
    join(pkgDir, format, file),
    ["--external:runlock"],
  );
  // One copy of the error classes: none may be defined in this bundle.
  const code = readFileSync(join(pkgDir, format, file), "utf8");
  for (const name of errorNames) {
    if (new RegExp(`\\bclass ${name}\\b`).test(code)) {
      throw new Error(
        `${format}/${file} defines its own ${name}: "instanceof" would fail across "runlock" and "runlock/postgres"`,
      );
    }
  }
}
rmSync(pgTree, { recursive: true, force: true });

// "runlock/cli": main() and CliIo, for programs that run the command line
// in-process. It imports the library through the package's own name
// (external), so that a program importing both "runlock" and "runlock/cli"
// has one copy of the library and its per-process state; likewise the
// PostgreSQL backend (loaded by --db only) as "runlock/postgres". The CLI
// is src/cli.js and src/cli/*.js: in a copy of those (and of version.js and
// _process.js, constants, _redact.js, a function without state, which
// the backend's messages use too, platform/runtime.js, the runtime's name,
// permissions and host name, and _inherit.js, a symbol from the global
// registry), every import of mod.js, whoever makes it, becomes
// "runlock", and every import() of src/postgres/mod.js "runlock/postgres".
const libraryModule = join(tscOut, "mod.js");
const pgModule = join(tscOut, "src", "postgres", "mod.js");
const versionModule = join(tscOut, "src", "version.js");
const processModule = join(tscOut, "src", "_process.js");
const redactModule = join(tscOut, "src", "_redact.js");
const runtimeModule = join(tscOut, "src", "platform", "runtime.js");
const inheritModule = join(tscOut, "src", "file", "_inherit.js");
const cliDir = join(tscOut, "src", "cli");
const cliFiles = [
  join(tscOut, "src", "cli.js"),
  ...walk(cliDir).filter((f) => f.endsWith(".js")),
  versionModule,
  processModule,
  redactModule,
  runtimeModule,
  inheritModule,
];
for (const [format, file] of [["esm", "cli.js"], ["cjs", "cli.cjs"]] as const) {
  const cliTree = join(out, `.tsc-cli-${format}`);
  for (const source of cliFiles) {
    const target = (spec: string) => join(dirname(source), spec);
    const text = readFileSync(source, "utf8")
      .replace(
        /from (["'])(\.{1,2}\/[^"']+)\1/g,
        (m, _q, spec) => target(spec) === libraryModule ? 'from "runlock"' : m,
      )
      .replace(
        /import\((["'])(\.{1,2}\/[^"']+)\1\)/g,
        (m, _q, spec) =>
          target(spec) !== pgModule
            ? m
            // esbuild keeps import() in CommonJS output, and Node's import()
            // takes the package's "import" condition: a CommonJS program
            // would get the ES module copy of the library beside its own.
            // require() keeps it on the CommonJS copy.
            : format === "esm"
            ? 'import("runlock/postgres")'
            : 'Promise.resolve().then(() => require("runlock/postgres"))',
      );
    // Anything else relative but the CLI's own files, version.js and
    // _process.js (constants) and _redact.js (no state) would be a second
    // copy of library code in this bundle.
    const unmapped = [
      ...text.matchAll(/(?:from |import\()["'](\.{1,2}\/[^"']+)["']/g),
    ]
      .map(([, spec]) => spec)
      .filter((spec) =>
        target(spec) !== versionModule && target(spec) !== processModule &&
        target(spec) !== redactModule && target(spec) !== inheritModule &&
        target(spec) !== runtimeModule &&
        !target(spec).startsWith(cliDir + "/")
      );
    if (unmapped.length > 0) {
      throw new Error(
        `${relative(tscOut, source)} imports ${
          unmapped.join(", ")
        }: map it for "runlock/cli" in scripts/build_npm.ts`,
      );
    }
    write(join(cliTree, relative(tscOut, source)), text);
  }
  const lib = join(cliTree, "src", "cli.js");
  bundle(
    format,
    lib,
    join(pkgDir, format, file),
    [
      "--external:runlock",
      "--external:runlock/postgres",
      // cli.ts runs main itself when it is the entry module; a library never
      // is.
      "--define:import.meta.main=false",
    ],
  );
  const code = readFileSync(join(pkgDir, format, file), "utf8");
  if (/\bclass (HeldError|PgLock|KeyCollisionError)\b/.test(code)) {
    throw new Error(`${format}/${file} bundles the library or the backend`);
  }
  rmSync(cliTree, { recursive: true, force: true });
}

// The `runlock` bin: the CLI and the library in one ES module file. The
// PostgreSQL backend, which the CLI imports dynamically (--db only), goes
// in the same file (esbuild wraps it so that it runs only when imported),
// with its one copy of the errors; `pg` stays external. A `bun build
// --compile` of this file bundles `pg` from node_modules, so the binary
// works with --db too.
// The CLI is imported dynamically, so that a platform the file locks do not
// run on (UnsupportedPlatformError, thrown as they load) is said in one
// line, as the CLI's other errors are, not as a stack trace.
write(
  join(tscOut, "bin.js"),
  `import process from "node:process";\n` +
    `let cli;\n` +
    `try {\n` +
    `  cli = await import("./src/cli.js");\n` +
    `} catch (err) {\n` +
    `  process.stderr.write(\`runlock: \${err?.message ?? err}\\n\`);\n` +
    `  process.exit(2);\n` +
    `}\n` +
    `process.exitCode = await cli.main(process.argv.slice(2));\n`,
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
    "esm/postgres.js",
    "cjs/postgres.cjs",
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
    "./postgres": {
      import: {
        types: "./esm/src/postgres/mod.d.ts",
        default: "./esm/postgres.js",
      },
      require: {
        types: "./cjs/src/postgres/mod.d.cts",
        default: "./cjs/postgres.cjs",
      },
    },
    "./package.json": "./package.json",
  },
  bin: { runlock: "bin/runlock.js" },
  files: [
    "esm/",
    "cjs/",
    "cli/",
    "postgres/",
    "bin/",
    "README.md",
    "LICENSE",
    "PROTOCOL.md",
    "CHANGELOG.md",
    "docs/",
  ],
  sideEffects: false,
  engines: { node: ">=20" },
  // Only what the test suite runs on (Linux x86_64): npm refuses to install
  // the package elsewhere rather than let it fail at its first lock.
  os: ["linux"],
  cpu: ["x64"],
  dependencies,
  // pg is about 1 MB in 14 small packages, which file-lock users never
  // need: an optional peer (the way database drivers are shipped), so a
  // PostgreSQL user installs it (`npm install runlock pg`).
  peerDependencies,
  peerDependenciesMeta: { pg: { optional: true } },
};
write(join(pkgDir, "package.json"), JSON.stringify(pkg, null, 2) + "\n");
// For resolvers that predate "exports" (TypeScript's moduleResolution
// "node10", old bundlers): "runlock/cli" is then the directory cli/, and
// "runlock/postgres" the directory postgres/.
for (const [dir, types] of [["cli", "cli"], ["postgres", "postgres/mod"]]) {
  write(
    join(pkgDir, dir, "package.json"),
    JSON.stringify(
      {
        private: true,
        main: `../cjs/${dir}.cjs`,
        types: `../cjs/src/${types}.d.cts`,
      },
      null,
      2,
    ) + "\n",
  );
}
for (const file of ["README.md", "LICENSE", "PROTOCOL.md", "CHANGELOG.md"]) {
  copyFileSync(join(root, file), join(pkgDir, file));
}
// The guides the README links to, beside it.
cpSync(join(root, "docs"), join(pkgDir, "docs"), { recursive: true });

// 4. The test suite, compiled for Node and Bun. Tests import the library
// through ./_entry.js, the CLI module through ./_cli_entry.js and the
// PostgreSQL backend through ./_entry_postgres.js, which scripts/test_npm.ts
// points at the package's ESM or CommonJS entries; everything else is the
// same file. (tests/fixtures/pg_measure.ts, a by-hand baseline that imports
// pg itself, is compiled too: it runs under Node with the package's pg.)
const testFiles = walk(join(root, "tests")).filter((f) => f.endsWith(".ts"));
for (const file of testFiles) {
  const rel = relative(join(root, "tests"), file);
  // The entries sit at the top of npm/tests, above tests/file/, tests/cli/,
  // tests/fixtures/, ...
  const up = "../".repeat(rel.split("/").length - 1) || "./";
  const source = bareNpmSpecifiers(readFileSync(file, "utf8"), rel, [
    "fast-check",
  ])
    .replace(
      /(["'])(?:\.\.\/)+mod\.ts\1/g,
      (_m, q) => `${q}${up}_entry.js${q}`,
    )
    .replace(
      /(["'])(?:(?:\.\.\/)+src\/postgres\/mod\.ts|@runlock\/runlock\/postgres)\1/g,
      (_m, q) => `${q}${up}_entry_postgres.js${q}`,
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
const pgNames = Object.keys(await import("../src/postgres/mod.ts")).sort();
write(
  join(out, "tests", "_entry_postgres.esm.js"),
  `export * from "runlock/postgres";\n`,
);
write(
  join(out, "tests", "_entry_postgres.cjs.js"),
  `import { createRequire } from "node:module";\n` +
    `const postgres = createRequire(import.meta.url)("runlock/postgres");\n` +
    `export const { ${pgNames.join(", ")} } = postgres;\n`,
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
