// The npm packages the sources, tests and scripts use, each at the one
// version they name in full where they import it (`npm:pg@8.23.1`): no
// import map, because `deno task` sets up every package an import map
// names before any task (the demo would download all four).
// (Hence deno.json turns off the lint rule no-import-prefix.)
// scripts/build_npm.ts checks every npm: specifier against this table and
// pins the package's dependencies from it.

/** Package name → exact version. */
export const NPM_PINS: Readonly<Record<string, string>> = {
  koffi: "3.3.4",
  pg: "8.23.1",
  "fast-check": "4.11.0",
  typescript: "5.9.3",
};
