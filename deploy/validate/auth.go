package validate

import (
	"net"
	"strings"
)

// minJWTSecret is the fewest bytes shop takes in SHOP_JWT_SECRET
// (internal/auth's MinSecret).
const minJWTSecret = 32

// newJWTSecret is a command that makes a secret shop takes.
const newJWTSecret = `head -c 32 /dev/urandom | base64`

// checkAuth checks that a deployment authenticates its buyers: SHOP_AUTH=jwt
// with exactly one way to check a token, an HS256 secret shop takes or the
// file of an identity provider's public keys, and the issuer and the
// audience a token must name. Without it (SHOP_AUTH=none, shop's default)
// anyone places, reads, cancels and blocks orders as any user_id; a
// deployment carrying an empty secret's placeholder would never start.
// The problems never quote a secret.
func checkAuth(p *problems, where string, env map[string]string) {
	if mode := env["SHOP_AUTH"]; mode != "jwt" {
		p.addf("%s: SHOP_AUTH=%q: a shipped deployment authenticates its buyers (SHOP_AUTH=jwt); without it anyone orders, reads and cancels as any user_id", where, mode)
		return
	}
	secret, keys := env["SHOP_JWT_SECRET"], env["SHOP_JWT_PUBLIC_KEYS"]
	switch {
	case secret != "" && keys != "":
		p.addf("%s: SHOP_JWT_SECRET and SHOP_JWT_PUBLIC_KEYS are both set; shop serve takes exactly one", where)
	case secret == "" && keys == "":
		p.addf("%s: SHOP_JWT_SECRET is empty (and no SHOP_JWT_PUBLIC_KEYS): with SHOP_AUTH=jwt, shop serve refuses to start without the key buyers' tokens are signed with; make a secret with %s and give it to what issues the tokens", where, newJWTSecret)
	case secret != "" && strings.TrimSpace(secret) != secret:
		p.addf("%s: SHOP_JWT_SECRET begins or ends with white space, which shop serve refuses", where)
	case secret != "" && len(secret) < minJWTSecret:
		p.addf("%s: SHOP_JWT_SECRET has %d bytes; shop wants at least %d (make one with %s)", where, len(secret), minJWTSecret, newJWTSecret)
	}
	for _, name := range []string{"SHOP_JWT_ISSUER", "SHOP_JWT_AUDIENCE"} {
		if env[name] == "" {
			p.addf("%s: %s is not set: a token issued for anything else by the same key would be taken", where, name)
		}
	}
}

// checkTrustedProxies checks SHOP_TRUSTED_PROXIES of a replica that sits
// behind a proxy on another host: set, and not loopback alone (shop's
// default), which no request reaching a container or a pod comes from, so
// that every client would be the proxy's address. When proxy is not nil,
// the list must name it.
func checkTrustedProxies(p *problems, where string, env map[string]string, proxy net.IP) {
	v := strings.TrimSpace(env["SHOP_TRUSTED_PROXIES"])
	if v == "" || v == "none" {
		p.addf("%s: SHOP_TRUSTED_PROXIES is %q: set it to the proxies in front of the replicas, or every client is the proxy's address", where, v)
		return
	}
	nets := []*net.IPNet{}
	for _, s := range strings.Split(v, ",") {
		s = strings.TrimSpace(s)
		if ip := net.ParseIP(s); ip != nil && ip.To4() != nil {
			s += "/32"
		} else if ip != nil {
			s += "/128"
		}
		_, n, err := net.ParseCIDR(s)
		if err != nil {
			p.addf("%s: SHOP_TRUSTED_PROXIES: %q is neither an address nor a CIDR range", where, s)
			return
		}
		nets = append(nets, n)
	}
	loopback := true
	for _, n := range nets {
		loopback = loopback && n.IP.IsLoopback()
	}
	if loopback {
		p.addf("%s: SHOP_TRUSTED_PROXIES=%s trusts loopback alone, which no request from the proxy in front comes from", where, v)
	}
	if proxy != nil && !containsIP(nets, proxy) {
		p.addf("%s: SHOP_TRUSTED_PROXIES=%s does not name nginx's address, %s", where, v, proxy)
	}
}

func containsIP(nets []*net.IPNet, ip net.IP) bool {
	for _, n := range nets {
		if n.Contains(ip) {
			return true
		}
	}
	return false
}
