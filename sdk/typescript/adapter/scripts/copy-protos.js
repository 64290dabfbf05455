// Copies the protocol's .proto files into the package before it is packed, so that a package
// installed outside the repository carries them (src/proto.js finds either copy).
import { cpSync, mkdirSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const pkg = path.join(path.dirname(fileURLToPath(import.meta.url)), '..');
const repo = path.join(pkg, '..', '..', '..', 'proto');
for (const file of ['integrations/adapter/v1/adapter.proto', 'integrations/adapter/v1/callback.proto',
  'integrations/execution/v1/execution.proto', 'integrations/errors/v1/errors.proto']) {
  mkdirSync(path.dirname(path.join(pkg, 'proto', file)), { recursive: true });
  cpSync(path.join(repo, file), path.join(pkg, 'proto', file));
}
