// Package payments turns a payment provider's signed HTTP request into a
// verified, provider-neutral Event: a payment received, a refund settled or
// failed, or an event to acknowledge and ignore. It reads no database and
// serves no route; the handler reads the raw body (at most MaxBody bytes),
// calls a Verifier, maps ErrSignature to 401 and ErrMalformed to 400, and
// hands the Event to the order lifecycle.
//
// Two providers are verified:
//
//   - Standard (SHOP_PAYMENTS=webhook): Standard Webhooks, with the
//     specification's own Go package. The webhook-id, webhook-timestamp and
//     webhook-signature headers are required; the signature is an HMAC-SHA256
//     over the id, the timestamp and the body, with any of the secrets of
//     SHOP_PAYMENT_WEBHOOK_SECRET (a comma list, so that a new secret can be
//     added before the old one is removed).
//   - Stripe (SHOP_PAYMENTS=stripe): the Stripe-Signature header, with
//     stripe-go's webhook.ConstructEventWithOptions, which also refuses an
//     event whose API version is not the release train stripe-go is built
//     for, since its objects would be decoded by the wrong shape.
//
// For both, a timestamp more than Tolerance away from now, in either
// direction, is refused as a bad signature: a signed request recorded by
// someone on the way cannot be replayed later than that.
//
// The signature and the timestamp are checked before a single byte of the
// body is parsed, and before anything else is done with the request. Until
// then the body is whatever anyone on the internet sent, so parsing it first
// would let anyone reach the JSON decoder and our validation rules, learn from
// a 400 which of them a forged event broke, and spend our CPU without knowing
// the secret. Once the signature holds, the body is the provider's word, and
// a body that breaks a rule is the provider's mistake, answered 400 with
// nothing written.
package payments
