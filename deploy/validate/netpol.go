package validate

import (
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// monitoringNamespace is the namespace whose pods (Prometheus) may reach
// the replicas' operators' listener.
const monitoringNamespace = "monitoring"

// namespaceNameLabel is the label the API server gives every namespace,
// its name.
const namespaceNameLabel = "kubernetes.io/metadata.name"

// checkPolicies checks the NetworkPolicies of the replicas' pods (labels
// podLabels in namespace ns): at least one selects them for ingress, so
// that what none admits is refused; every rule that admits the operators'
// port (admin) admits pods of the monitoring namespace alone, for that
// port takes the admin token, one guess at a time; and a rule admits the
// public port (port) from anywhere, or the Service's traffic would not
// reach them.
func (m *Manifests) checkPolicies(p *problems, ns string, podLabels map[string]string, c corev1.Container, admin, port int) {
	var selecting []networkingv1.NetworkPolicy
	for _, np := range m.Policies {
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil {
			p.addf("NetworkPolicy %s: podSelector: %v", np.Name, err)
			continue
		}
		if np.Namespace == ns && sel.Matches(labels.Set(podLabels)) && governsIngress(np) {
			selecting = append(selecting, np)
		}
	}
	if len(selecting) == 0 {
		p.addf("no NetworkPolicy selects the replicas' pods for ingress: the operators' port %d (/api/v1/admin/*, /metrics) is open to every pod of the cluster; admit it from the namespace %s alone", admin, monitoringNamespace)
		return
	}
	public := false
	for _, np := range selecting {
		for i, rule := range np.Spec.Ingress {
			where := fmt.Sprintf("NetworkPolicy %s: ingress rule %d", np.Name, i+1)
			if admitsPort(rule.Ports, c, admin) {
				if len(rule.From) == 0 {
					p.addf("%s admits the operators' port %d from anywhere; want pods of the namespace %s alone", where, admin, monitoringNamespace)
				}
				for _, peer := range rule.From {
					if !fromNamespaceOnly(peer, monitoringNamespace) {
						p.addf("%s admits the operators' port %d from %s; want pods of the namespace %s alone (a namespaceSelector of %s: %s)",
							where, admin, describePeer(peer), monitoringNamespace, namespaceNameLabel, monitoringNamespace)
					}
				}
			}
			if admitsPort(rule.Ports, c, port) && len(rule.From) == 0 {
				public = true
			}
		}
	}
	if !public {
		p.addf("no NetworkPolicy admits the public port %d from anywhere: the Service's and the ingress's traffic would not reach the replicas", port)
	}
}

// governsIngress reports whether np restricts ingress: policyTypes names
// Ingress, or is empty (then Ingress is implied).
func governsIngress(np networkingv1.NetworkPolicy) bool {
	return len(np.Spec.PolicyTypes) == 0 || slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress)
}

// admitsPort reports whether ports (a rule's; none: every port) admit TCP
// to c's port number port, named or by number.
func admitsPort(ports []networkingv1.NetworkPolicyPort, c corev1.Container, port int) bool {
	if len(ports) == 0 {
		return true
	}
	for _, pp := range ports {
		if pp.Protocol != nil && *pp.Protocol != corev1.ProtocolTCP {
			continue
		}
		if pp.Port == nil {
			return true
		}
		n, ok := containerPort(c, *pp.Port)
		end := n
		if pp.EndPort != nil {
			end = int(*pp.EndPort)
		}
		if ok && n <= port && port <= end {
			return true
		}
	}
	return false
}

// fromNamespaceOnly reports whether peer is the pods of namespace name: a
// namespaceSelector of exactly its name label, no ipBlock.
func fromNamespaceOnly(peer networkingv1.NetworkPolicyPeer, name string) bool {
	sel := peer.NamespaceSelector
	return peer.IPBlock == nil && sel != nil && len(sel.MatchExpressions) == 0 &&
		maps.Equal(sel.MatchLabels, map[string]string{namespaceNameLabel: name})
}

// describePeer says which sources a peer admits.
func describePeer(peer networkingv1.NetworkPolicyPeer) string {
	switch {
	case peer.IPBlock != nil:
		return "ipBlock " + peer.IPBlock.CIDR
	case peer.NamespaceSelector == nil:
		return "the pods of its own namespace"
	default:
		return "namespaceSelector " + metav1.FormatLabelSelector(peer.NamespaceSelector)
	}
}
