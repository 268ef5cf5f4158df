package payments_test

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"shop/internal/payments"
)

// Secrets of 24 and 32 bytes, and one the service was not given.
var (
	secretA     = whsec(bytes.Repeat([]byte{0xa1}, 24))
	secretB     = whsec(bytes.Repeat([]byte{0xb2}, 32))
	secretOther = whsec(bytes.Repeat([]byte{0xc3}, 32))
)

const msgID = "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"

func whsec(key []byte) string { return "whsec_" + base64.StdEncoding.EncodeToString(key) }

func newStandard(t *testing.T, secrets string) *payments.Standard {
	t.Helper()
	v, err := payments.NewStandard(secrets)
	if err != nil {
		t.Fatalf("NewStandard: %v", err)
	}
	return v
}

// signature signs a message with the library's own Sign.
func signature(t *testing.T, secret, id string, ts time.Time, body []byte) string {
	t.Helper()
	hook, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := hook.Sign(id, ts, body)
	if err != nil {
		t.Fatal(err)
	}
	return sig
}

// signed returns the headers of a message signed with secret at ts.
func signed(t *testing.T, secret string, ts time.Time, body []byte) http.Header {
	t.Helper()
	h := http.Header{}
	h.Set(standardwebhooks.HeaderWebhookID, msgID)
	h.Set(standardwebhooks.HeaderWebhookTimestamp, strconv.FormatInt(ts.Unix(), 10))
	h.Set(standardwebhooks.HeaderWebhookSignature, signature(t, secret, msgID, ts, body))
	return h
}

const (
	paymentBody = `{"type":"payment.succeeded","timestamp":"2023-11-14T22:13:20Z","data":{"order_id":1234,"payment_id":"pay_1","amount_cents":1099,"currency":"usd","note":"unknown fields are fine"}}`
	refundBody  = `{"type":"refund.succeeded","data":{"refund_id":"` + refundID + `","provider_refund_id":"rf 1/2"}}`
)

var (
	wantPayment = payments.Event{ID: msgID, Type: payments.TypePaymentSucceeded, Payment: &payments.Payment{
		OrderID: 1234, PaymentID: "pay_1", AmountCents: 1099, Currency: "USD",
	}}
	wantRefund = payments.Event{ID: msgID, Type: payments.TypeRefundSucceeded, Refund: &payments.RefundUpdate{
		RefundID: refundID, ProviderRefundID: "rf 1/2", Status: payments.RefundSucceeded,
	}}
)

// The specification's own test vector verifies: the error is about its
// body, which is not an event of ours, not about its signature. One byte
// changed, and it does not.
func TestStandardSpecificationVector(t *testing.T) {
	v := newStandard(t, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	ts := time.Unix(1614265330, 0)
	h := http.Header{}
	h.Set("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek")
	h.Set("webhook-timestamp", "1614265330")
	h.Set("webhook-signature", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
	e, err := v.Verify(h, []byte(`{"test": 2432232314}`), ts)
	wantErr(t, e, err, payments.ErrMalformed)
	e, err = v.Verify(h, []byte(`{"test": 2432232315}`), ts)
	wantErr(t, e, err, payments.ErrSignature)
}

func TestStandardEvents(t *testing.T) {
	v := newStandard(t, secretA)
	tests := []struct {
		name string
		body string
		want payments.Event
	}{
		{"payment", paymentBody, wantPayment},
		{"refund", refundBody, wantRefund},
		{"largest order id", `{"type":"payment.succeeded","data":{"order_id":9223372036854775807,"payment_id":"p","amount_cents":1,"currency":"EUR"}}`,
			payments.Event{ID: msgID, Type: payments.TypePaymentSucceeded, Payment: &payments.Payment{
				OrderID: 9223372036854775807, PaymentID: "p", AmountCents: 1, Currency: "EUR",
			}}},
		{"white space around values", " {\"type\" : \"refund.succeeded\" ,\n\t\"data\" : { \"refund_id\" : \"" + refundID + "\" , \"provider_refund_id\" : \"rf 1/2\" } }\n", wantRefund},
		{"order id with white space", `{"type":"payment.succeeded","data":{"order_id": 1234 ,"payment_id":"pay_1","amount_cents":` + "\n1099\t" + `,"currency":"usd"}}`, wantPayment},
		{"another type", `{"type":"payment.failed","data":{"order_id":"anything"}}`,
			payments.Event{ID: msgID, Type: payments.TypeOther, Ignored: payments.IgnoredType}},
		{"another type without data", `{"type":"ping"}`,
			payments.Event{ID: msgID, Type: payments.TypeOther, Ignored: payments.IgnoredType}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := v.Verify(signed(t, secretA, now, []byte(tt.body)), []byte(tt.body), now)
			wantEvent(t, e, err, tt.want)
		})
	}
}

// A timestamp exactly Tolerance away either way is in time.
func TestStandardToleranceEdges(t *testing.T) {
	v := newStandard(t, secretA)
	for _, ts := range []time.Time{now.Add(-payments.Tolerance), now.Add(payments.Tolerance)} {
		e, err := v.Verify(signed(t, secretA, ts, []byte(paymentBody)), []byte(paymentBody), now)
		wantEvent(t, e, err, wantPayment)
	}
}

// A sender that rotates its secret signs with each: any one of the
// space-separated signatures that matches is enough, wherever it stands.
func TestStandardSeveralSignatures(t *testing.T) {
	v := newStandard(t, secretA)
	body := []byte(paymentBody)
	good := signature(t, secretA, msgID, now, body)
	other := signature(t, secretOther, msgID, now, body)
	for _, sigs := range []string{
		other + " " + good,
		good + " " + other,
		other + " v1a,c2lnbmVkIHdpdGggZWQyNTUxOQ== " + good, // an asymmetric one we cannot check
		"v2," + strings.TrimPrefix(other, "v1,") + " " + good,
		"garbage " + good,
	} {
		h := signed(t, secretA, now, body)
		h.Set(standardwebhooks.HeaderWebhookSignature, sigs)
		e, err := v.Verify(h, body, now)
		wantEvent(t, e, err, wantPayment)
	}
}

// Each secret of the list verifies, in any position; a secret not on it
// does not.
func TestStandardRotation(t *testing.T) {
	v := newStandard(t, secretA+","+secretB)
	body := []byte(refundBody)
	for _, secret := range []string{secretA, secretB} {
		e, err := v.Verify(signed(t, secret, now, body), body, now)
		wantEvent(t, e, err, wantRefund)
	}
	e, err := v.Verify(signed(t, secretOther, now, body), body, now)
	wantErr(t, e, err, payments.ErrSignature)
}

// Every request not proven to be the provider's is ErrSignature, and its
// body is not read: each case's body is also malformed, which would be
// ErrMalformed had it been parsed.
func TestStandardBadSignature(t *testing.T) {
	v := newStandard(t, secretA)
	// The body is malformed (amount_cents is a string); each case signs it
	// or something else.
	body := []byte(`{"type":"payment.succeeded","data":{"order_id":1,"payment_id":"p","amount_cents":"1","currency":"USD"}}`)
	tests := []struct {
		name string
		// request returns the headers and body sent.
		request func(t *testing.T) (http.Header, []byte)
	}{
		{"valid but malformed (control)", nil},
		{"tampered body", func(t *testing.T) (http.Header, []byte) {
			return signed(t, secretA, now, body), bytes.Replace(body, []byte(`"p"`), []byte(`"q"`), 1)
		}},
		{"wrong secret", func(t *testing.T) (http.Header, []byte) {
			return signed(t, secretOther, now, body), body
		}},
		{"another message id", func(t *testing.T) (http.Header, []byte) {
			h := signed(t, secretA, now, body)
			h.Set(standardwebhooks.HeaderWebhookID, msgID+"x")
			return h, body
		}},
		{"timestamp changed after signing", func(t *testing.T) (http.Header, []byte) {
			h := signed(t, secretA, now, body)
			h.Set(standardwebhooks.HeaderWebhookTimestamp, strconv.FormatInt(now.Unix()+1, 10))
			return h, body
		}},
		{"old timestamp", func(t *testing.T) (http.Header, []byte) {
			return signed(t, secretA, now.Add(-payments.Tolerance-time.Second), body), body
		}},
		{"an hour old", func(t *testing.T) (http.Header, []byte) {
			return signed(t, secretA, now.Add(-time.Hour), body), body
		}},
		{"future timestamp", func(t *testing.T) (http.Header, []byte) {
			return signed(t, secretA, now.Add(payments.Tolerance+time.Second), body), body
		}},
		{"timestamp not a number", func(t *testing.T) (http.Header, []byte) {
			h := signed(t, secretA, now, body)
			h.Set(standardwebhooks.HeaderWebhookTimestamp, "2023-11-14T22:13:20Z")
			return h, body
		}},
		{"timestamp in milliseconds", func(t *testing.T) (http.Header, []byte) {
			h := signed(t, secretA, now, body)
			h.Set(standardwebhooks.HeaderWebhookTimestamp, strconv.FormatInt(now.UnixMilli(), 10))
			return h, body
		}},
		{"no webhook-id", func(t *testing.T) (http.Header, []byte) {
			h := signed(t, secretA, now, body)
			h.Del(standardwebhooks.HeaderWebhookID)
			return h, body
		}},
		{"no webhook-timestamp", func(t *testing.T) (http.Header, []byte) {
			h := signed(t, secretA, now, body)
			h.Del(standardwebhooks.HeaderWebhookTimestamp)
			return h, body
		}},
		{"no webhook-signature", func(t *testing.T) (http.Header, []byte) {
			h := signed(t, secretA, now, body)
			h.Del(standardwebhooks.HeaderWebhookSignature)
			return h, body
		}},
		{"no headers", func(t *testing.T) (http.Header, []byte) { return http.Header{}, body }},
		{"signature without version", func(t *testing.T) (http.Header, []byte) {
			h := signed(t, secretA, now, body)
			h.Set(standardwebhooks.HeaderWebhookSignature, strings.TrimPrefix(h.Get(standardwebhooks.HeaderWebhookSignature), "v1,"))
			return h, body
		}},
		{"right signature under another version", func(t *testing.T) (http.Header, []byte) {
			h := signed(t, secretA, now, body)
			h.Set(standardwebhooks.HeaderWebhookSignature, "v2,"+strings.TrimPrefix(h.Get(standardwebhooks.HeaderWebhookSignature), "v1,"))
			return h, body
		}},
		{"empty signature", func(t *testing.T) (http.Header, []byte) {
			h := signed(t, secretA, now, body)
			h.Set(standardwebhooks.HeaderWebhookSignature, "v1,")
			return h, body
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.request == nil {
				e, err := v.Verify(signed(t, secretA, now, body), body, now)
				wantErr(t, e, err, payments.ErrMalformed)
				return
			}
			h, b := tt.request(t)
			e, err := v.Verify(h, b, now)
			wantErr(t, e, err, payments.ErrSignature, secretA, secretOther)
		})
	}
}

// Every body that breaks a rule, correctly signed, is ErrMalformed.
func TestStandardMalformed(t *testing.T) {
	v := newStandard(t, secretA)
	payment := func(orderID, paymentID, amount, currency string) string {
		return fmt.Sprintf(`{"type":"payment.succeeded","data":{"order_id":%s,"payment_id":%s,"amount_cents":%s,"currency":%s}}`,
			orderID, paymentID, amount, currency)
	}
	refund := func(refundID, providerRefundID string) string {
		return fmt.Sprintf(`{"type":"refund.succeeded","data":{"refund_id":%s,"provider_refund_id":%s}}`, refundID, providerRefundID)
	}
	// Each valid field, to change one at a time.
	const o, p, a, c = `1`, `"pay_1"`, `100`, `"USD"`
	const r, pr = `"` + refundID + `"`, `"re_1"`
	without := func(body, field string) string {
		return strings.Replace(body, `"`+field+`":`, `"unknown_`+field+`":`, 1)
	}
	tests := []struct{ name, body string }{
		{"not JSON", `{"type":"payment.succeeded"`},
		{"empty body", ``},
		{"not an object", `["payment.succeeded"]`},
		{"no type", `{"data":{}}`},
		{"empty type", `{"type":"","data":{}}`},
		{"type not a string", `{"type":7,"data":{}}`},
		{"no data", `{"type":"payment.succeeded"}`},
		{"null data", `{"type":"payment.succeeded","data":null}`},
		{"data not an object", `{"type":"refund.succeeded","data":[1]}`},

		{"order_id missing", without(payment(o, p, a, c), "order_id")},
		{"order_id null", payment(`null`, p, a, c)},
		{"order_id zero", payment(`0`, p, a, c)},
		{"order_id negative", payment(`-1`, p, a, c)},
		{"order_id float", payment(`1.5`, p, a, c)},
		{"order_id float with no fraction", payment(`1.0`, p, a, c)},
		{"order_id exponent", payment(`1e3`, p, a, c)},
		{"order_id string", payment(`"1"`, p, a, c)},
		{"order_id too large", payment(`9223372036854775808`, p, a, c)},
		{"order_id bool", payment(`true`, p, a, c)},

		{"payment_id missing", without(payment(o, p, a, c), "payment_id")},
		{"payment_id empty", payment(o, `""`, a, c)},
		{"payment_id too long", payment(o, `"`+strings.Repeat("x", 65)+`"`, a, c)},
		{"payment_id with a space", payment(o, `"pay 1"`, a, c)},
		{"payment_id with a slash", payment(o, `"pay/1"`, a, c)},
		{"payment_id not ASCII", payment(o, `"päy"`, a, c)},
		{"payment_id number", payment(o, `12`, a, c)},
		{"payment_id null", payment(o, `null`, a, c)},

		{"amount_cents missing", without(payment(o, p, a, c), "amount_cents")},
		{"amount_cents zero", payment(o, p, `0`, c)},
		{"amount_cents negative", payment(o, p, `-100`, c)},
		{"amount_cents float", payment(o, p, `10.99`, c)},
		{"amount_cents string", payment(o, p, `"100"`, c)},
		{"amount_cents too large", payment(o, p, `99999999999999999999`, c)},

		{"currency missing", without(payment(o, p, a, c), "currency")},
		{"currency empty", payment(o, p, a, `""`)},
		{"currency two letters", payment(o, p, a, `"US"`)},
		{"currency four letters", payment(o, p, a, `"USDT"`)},
		{"currency with a digit", payment(o, p, a, `"US1"`)},
		{"currency not ASCII", payment(o, p, a, `"ÜSD"`)},
		{"currency number", payment(o, p, a, `840`)},

		{"refund_id missing", without(refund(r, pr), "refund_id")},
		{"refund_id empty", refund(`""`, pr)},
		{"refund_id short", refund(`"`+refundID[:25]+`"`, pr)},
		{"refund_id lower case", refund(`"`+strings.ToLower(refundID)+`"`, pr)},
		{"refund_id not base32", refund(`"01JABCDEFGHJKMNPQRSTVWXYZU"`, pr)},
		{"refund_id number", refund(`1`, pr)},
		{"provider_refund_id missing", without(refund(r, pr), "provider_refund_id")},
		{"provider_refund_id empty", refund(r, `""`)},
		{"provider_refund_id too long", refund(r, `"`+strings.Repeat("r", 256)+`"`)},
		{"provider_refund_id with a newline", refund(r, `"re\n1"`)},
		{"provider_refund_id not ASCII", refund(r, `"ré"`)},
		{"provider_refund_id number", refund(r, `1`)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := []byte(tt.body)
			e, err := v.Verify(signed(t, secretA, now, body), body, now)
			wantErr(t, e, err, payments.ErrMalformed)
		})
	}
	// The webhook-id is stored: it is held to the shape of its column.
	for _, id := range []string{strings.Repeat("m", 256), "msg\x01"} {
		body := []byte(paymentBody)
		h := signed(t, secretA, now, body)
		h.Set(standardwebhooks.HeaderWebhookID, id)
		h.Set(standardwebhooks.HeaderWebhookSignature, signature(t, secretA, id, now, body))
		e, err := v.Verify(h, body, now)
		wantErr(t, e, err, payments.ErrMalformed)
	}
}

func TestNewStandard(t *testing.T) {
	// Each case is the setting, the entry the error names, and what the
	// error says of it.
	short := whsec(bytes.Repeat([]byte{0xd4}, payments.MinSecret-1))
	tests := []struct{ secrets, entry, says string }{
		{"", "", "empty"},
		{"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "entry 1 of 1", "whsec_"},
		{"whsec_not*base64!", "entry 1 of 1", "base64"},
		{"whsec_" + base64.RawStdEncoding.EncodeToString(bytes.Repeat([]byte{1}, 32)), "entry 1 of 1", "base64"},
		{"whsec_" + base64.URLEncoding.EncodeToString(bytes.Repeat([]byte{0xfb}, 32)), "entry 1 of 1", "base64"},
		{short, "entry 1 of 1", "23 bytes"},
		{"whsec_", "entry 1 of 1", "0 bytes"},
		{secretA + "," + short, "entry 2 of 2", "23 bytes"},
		{secretA + ",," + secretB, "entry 2 of 3", "empty"},
		{secretA + ",", "entry 2 of 2", "empty"},
		{"," + secretA, "entry 1 of 2", "empty"},
		{secretA + ", " + secretB, "entry 2 of 2", "white space"},
		{secretA + "\n", "entry 1 of 1", "white space"},
	}
	for _, tt := range tests {
		v, err := payments.NewStandard(tt.secrets)
		if err == nil {
			t.Errorf("NewStandard(%q) = %v, want an error", tt.secrets, v)
			continue
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "SHOP_PAYMENT_WEBHOOK_SECRET") || !strings.Contains(msg, tt.entry) || !strings.Contains(msg, tt.says) {
			t.Errorf("NewStandard(%q): %q, want SHOP_PAYMENT_WEBHOOK_SECRET, %q and %q", tt.secrets, msg, tt.entry, tt.says)
		}
		for entry := range strings.SplitSeq(tt.secrets, ",") {
			if key := strings.TrimSpace(strings.TrimPrefix(entry, "whsec_")); len(key) > 4 && strings.Contains(msg, key) {
				t.Errorf("NewStandard(%q): %q shows a secret", tt.secrets, msg)
			}
		}
	}
	// The shortest key allowed, and a list of three.
	for _, ok := range []string{whsec(bytes.Repeat([]byte{7}, payments.MinSecret)), secretA + "," + secretB + "," + secretOther} {
		if v, err := payments.NewStandard(ok); err != nil || v.Provider() != payments.ProviderWebhook {
			t.Errorf("NewStandard(%q) = %v, %v; want a %s verifier", ok, v, err, payments.ProviderWebhook)
		}
	}
}

// A provider signs its event with the secret; the service verifies it and
// reads a Payment.
func ExampleStandard_Verify() {
	secret := "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	body := []byte(`{"type":"payment.succeeded","data":{"order_id":42,"payment_id":"pay_7","amount_cents":1099,"currency":"eur"}}`)
	sent := time.Now()

	// The provider's side.
	hook, _ := standardwebhooks.NewWebhook(secret)
	sig, _ := hook.Sign("msg_1", sent, body)
	h := http.Header{}
	h.Set("webhook-id", "msg_1")
	h.Set("webhook-timestamp", strconv.FormatInt(sent.Unix(), 10))
	h.Set("webhook-signature", sig)

	// The service's side.
	v, err := payments.NewStandard(secret)
	if err != nil {
		fmt.Println(err)
		return
	}
	e, err := v.Verify(h, body, time.Now())
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%s %s %+v\n", e.ID, e.Type, *e.Payment)
	// Output: msg_1 payment.succeeded {OrderID:42 PaymentID:pay_7 AmountCents:1099 Currency:EUR}
}
