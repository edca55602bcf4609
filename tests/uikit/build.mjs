// Bundles app/ (the React UI kit app) into the folder given as the only argument: index.html,
// main.js, main.css and the kit's assets. Run by run.py at test time; the output is git-ignored.
import { build } from 'esbuild';
import { copyFileSync, mkdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const out = process.argv[2];
if (!out) {
  console.error('usage: node build.mjs OUTDIR');
  process.exit(2);
}
mkdirSync(out, { recursive: true });
await build({
  entryPoints: [join(here, 'app', 'main.jsx')],
  bundle: true,
  outdir: out,
  format: 'iife',
  jsx: 'automatic',
  target: 'chrome120',
  define: { 'process.env.NODE_ENV': '"production"' },
  loader: { '.svg': 'file', '.png': 'file', '.woff': 'file', '.woff2': 'file', '.ttf': 'file' },
  sourcemap: true,
  logLevel: 'warning',
});
copyFileSync(join(here, 'app', 'index.html'), join(out, 'index.html'));
