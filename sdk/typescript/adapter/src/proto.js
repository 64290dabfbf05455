// The protocol's messages, loaded from the repository's .proto files with @grpc/proto-loader
// (keepCase: the proto's own field names, as docs/adapter-protocol.md spells them), and the few
// google.rpc messages the refusal marker and the callback refusals use, defined here: they are
// three small, frozen messages, and loading googleapis for them would be the heavier choice.
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import path from 'node:path';
import protoLoader from '@grpc/proto-loader';
import protobuf from 'protobufjs';

const here = path.dirname(fileURLToPath(import.meta.url));

/**
 * The directory holding integrations/adapter/v1/*.proto: the package's own copy (a packed
 * package carries one, see scripts/copy-protos.js) or, in the repository, proto/ at its root.
 */
export function protoDir() {
  for (const dir of [path.join(here, '..', 'proto'), path.join(here, '..', '..', '..', '..', 'proto')]) {
    if (existsSync(path.join(dir, 'integrations', 'adapter', 'v1', 'adapter.proto'))) return dir;
  }
  throw new Error('integrations adapter SDK: cannot find integrations/adapter/v1/adapter.proto');
}

/** Options shared by every load: see the package README for why each. */
export const loaderOptions = {
  keepCase: true,
  // int64 (Timestamp and Duration seconds) as decimal strings: exact, read with BigInt.
  longs: String,
  // Enums as their numbers: the digest encodes the number, a number the SDK does not know too.
  enums: Number,
  // Absent message fields stay absent (the digest tells an absent Timestamp from a zero one);
  // absent scalars are their zero values, read with ?? below.
  defaults: false,
  // A oneof's name says which member is set: a google.protobuf.Value without a kind is visible.
  oneofs: true,
  includeDirs: [],
};

let cached;

/** The package definition of the two adapter services (grpc-js service definitions and codecs). */
export function adapterPackage() {
  if (!cached) {
    const dir = protoDir();
    cached = protoLoader.loadSync(
      ['integrations/adapter/v1/adapter.proto', 'integrations/adapter/v1/callback.proto'],
      { ...loaderOptions, includeDirs: [dir] },
    );
  }
  return cached;
}

/** The grpc-js service definition of AdapterService. */
export function adapterService() {
  return adapterPackage()['integrations.adapter.v1.AdapterService'];
}

/** The grpc-js service definition of AdapterCallbackService. */
export function callbackService() {
  return adapterPackage()['integrations.adapter.v1.AdapterCallbackService'];
}

let reasons;

/**
 * errorReason answers name when the platform's ErrorReason enum
 * (integrations/errors/v1/errors.proto, loaded once from protoDir()) declares it, and throws
 * otherwise: the reasons the SDK compares or sends are the proto's, and a name that drifts from
 * it fails at load, not on the wire.
 */
export function errorReason(name) {
  if (!reasons) {
    const root = protobuf.loadSync(path.join(protoDir(), 'integrations', 'errors', 'v1', 'errors.proto'));
    reasons = root.lookupEnum('integrations.errors.v1.ErrorReason').values;
  }
  if (!Object.hasOwn(reasons, name) || reasons[name] === 0) {
    throw new Error(`integrations adapter SDK: ${name} is not a reason of integrations.errors.v1.ErrorReason`);
  }
  return name;
}

/** Decodes protobuf wire bytes of an ExecuteRequest or CancelRequest as the server does. */
export function decodeRequest(type, bytes) {
  const svc = adapterService();
  const method = type === 'ExecuteRequest' ? svc.Execute : type === 'CancelRequest' ? svc.Cancel : null;
  if (!method) throw new Error(`not a request to an adapter: ${type}`);
  return method.requestDeserialize(Buffer.from(bytes));
}

// google.rpc.Status, ErrorInfo and BadRequest (googleapis google/rpc/*.proto), by field number.
export const rpc = protobuf.Root.fromJSON({
  nested: {
    google: {
      nested: {
        protobuf: {
          nested: {
            Any: { fields: { type_url: { type: 'string', id: 1 }, value: { type: 'bytes', id: 2 } } },
          },
        },
        rpc: {
          nested: {
            Status: {
              fields: {
                code: { type: 'int32', id: 1 },
                message: { type: 'string', id: 2 },
                details: { rule: 'repeated', type: 'google.protobuf.Any', id: 3 },
              },
            },
            ErrorInfo: {
              fields: {
                reason: { type: 'string', id: 1 },
                domain: { type: 'string', id: 2 },
                metadata: { keyType: 'string', type: 'string', id: 3 },
              },
            },
            BadRequest: {
              fields: { field_violations: { rule: 'repeated', type: 'FieldViolation', id: 1 } },
              nested: {
                FieldViolation: {
                  fields: { field: { type: 'string', id: 1 }, description: { type: 'string', id: 2 } },
                },
              },
            },
          },
        },
      },
    },
  },
});

export const Status = rpc.lookupType('google.rpc.Status');
export const ErrorInfo = rpc.lookupType('google.rpc.ErrorInfo');
export const BadRequest = rpc.lookupType('google.rpc.BadRequest');
export const typeURL = {
  ErrorInfo: 'type.googleapis.com/google.rpc.ErrorInfo',
  BadRequest: 'type.googleapis.com/google.rpc.BadRequest',
};

/** Decodes a grpc-status-details-bin value: the Status and its ErrorInfo and BadRequest details. */
export function decodeStatus(bytes) {
  const st = Status.toObject(Status.decode(bytes), { defaults: true });
  const errorInfos = [];
  const fieldViolations = [];
  for (const d of st.details ?? []) {
    if (d.type_url === typeURL.ErrorInfo) {
      errorInfos.push(ErrorInfo.toObject(ErrorInfo.decode(d.value), { defaults: true }));
    } else if (d.type_url === typeURL.BadRequest) {
      fieldViolations.push(...BadRequest.toObject(BadRequest.decode(d.value), { defaults: true }).field_violations);
    }
  }
  return { code: st.code, message: st.message, errorInfos, fieldViolations };
}
