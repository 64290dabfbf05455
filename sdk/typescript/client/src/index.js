// @integrations/client: the platform's REST API from JavaScript and TypeScript.
export { Client, isSettled } from './client.js';
export { IntegrationsError, WaitTimeoutError } from './errors.js';
export { verifyWebhook, WebhookVerificationError } from './webhook.js';
