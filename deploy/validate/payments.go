package validate

import (
	"encoding/base64"
	"fmt"
	"strings"
	"time"
)

// minWebhookSecret is the fewest bytes a Standard Webhooks secret may
// decode to: what shop asks of SHOP_PAYMENT_WEBHOOK_SECRET.
const minWebhookSecret = 24

// newWebhookSecret is a command that makes a secret shop takes.
const newWebhookSecret = `echo "whsec_$(head -c 32 /dev/urandom | base64)"`

// checkPayments checks the payment settings of a process with env (where
// names it): a provider shop knows (SHOP_PAYMENTS), and, while orders wait
// for their payment (SHOP_PAY_WINDOW above 0, as by default), that
// provider's secrets. shop serve refuses to start without them, rather
// than take a buyer's word that they paid; a deployment carrying an empty
// placeholder would never start.
func (s Service) checkPayments(p *problems, where string, env map[string]string) {
	window, err := s.payWindow(env)
	if err != nil {
		p.addf("%s: %v", where, err)
		return
	}
	mode := settingOr(env, "SHOP_PAYMENTS", s.Defaults["SHOP_PAYMENTS"], "webhook")
	switch mode {
	case "webhook":
		if window > 0 {
			checkWebhookSecret(p, where, env["SHOP_PAYMENT_WEBHOOK_SECRET"], window)
		}
	case "stripe":
		for _, name := range []string{"SHOP_STRIPE_SECRET_KEY", "SHOP_STRIPE_WEBHOOK_SECRET"} {
			if window > 0 && env[name] == "" {
				p.addf("%s: %s is empty: with SHOP_PAYMENTS=stripe and a pay window (SHOP_PAY_WINDOW %s), shop serve refuses to start without it", where, name, window)
			}
		}
	default:
		p.addf("%s: SHOP_PAYMENTS=%q: shop takes payments from webhook (Standard Webhooks) or stripe", where, mode)
	}
}

// payWindow returns how long an order of a process with env waits for its
// payment: SHOP_PAY_WINDOW, or the service's default.
func (s Service) payWindow(env map[string]string) (time.Duration, error) {
	v := settingOr(env, "SHOP_PAY_WINDOW", s.Defaults["SHOP_PAY_WINDOW"])
	if v == "" {
		return 0, fmt.Errorf("SHOP_PAY_WINDOW: no value, and no default found in the service's source")
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("SHOP_PAY_WINDOW=%q: %w", v, err)
	}
	return d, nil
}

// settingOr returns env's value of name, or else the first of defaults
// that is not empty.
func settingOr(env map[string]string, name string, defaults ...string) string {
	if v := env[name]; v != "" {
		return v
	}
	for _, d := range defaults {
		if d != "" {
			return d
		}
	}
	return ""
}

// checkWebhookSecret checks SHOP_PAYMENT_WEBHOOK_SECRET's value: set, and
// each secret of its comma list (several while a secret is rotated)
// whsec_ and standard base64 of at least minWebhookSecret bytes. The
// problems name a secret by its place in the list, never its value.
func checkWebhookSecret(p *problems, where, value string, window time.Duration) {
	if value == "" {
		p.addf("%s: SHOP_PAYMENT_WEBHOOK_SECRET is empty: with a pay window (SHOP_PAY_WINDOW %s), shop serve refuses to start without the secret the payment provider signs its events with; set it to the provider's (whsec_…), or make one with %s and give it to the provider",
			where, window, newWebhookSecret)
		return
	}
	for i, secret := range strings.Split(value, ",") {
		raw, ok := strings.CutPrefix(secret, "whsec_")
		key, err := base64.StdEncoding.DecodeString(raw)
		switch {
		case !ok:
			p.addf("%s: SHOP_PAYMENT_WEBHOOK_SECRET: secret %d does not begin with whsec_", where, i+1)
		case err != nil:
			p.addf("%s: SHOP_PAYMENT_WEBHOOK_SECRET: secret %d is not whsec_ and standard base64: %v", where, i+1, err)
		case len(key) < minWebhookSecret:
			p.addf("%s: SHOP_PAYMENT_WEBHOOK_SECRET: secret %d decodes to %d bytes; shop wants at least %d (make one with %s)", where, i+1, len(key), minWebhookSecret, newWebhookSecret)
		}
	}
}
