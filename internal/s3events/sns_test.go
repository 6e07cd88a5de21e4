package s3events

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSNSStringToSign: the text SNS signs, per message type: a
// notification's Subject when it has one; a confirmation's SubscribeURL
// and Token, never its Subject.
func TestSNSStringToSign(t *testing.T) {
	t.Parallel()
	subject := "My subject"
	n := SNSMessage{Type: SNSNotification, Message: "My Test Message", MessageID: "4d4dc071-ddbf-465d-bba8-08f81c89da64",
		Subject: &subject, Timestamp: "2019-01-31T04:37:04.321Z", TopicArn: "arn:aws:sns:us-east-2:123456789012:s4-MySNSTopic-1G1WEFCOXTC0P",
		Token: "ignored", SubscribeURL: "ignored"}
	text, err := n.StringToSign()
	require.NoError(t, err)
	require.Equal(t, "Message\nMy Test Message\nMessageId\n4d4dc071-ddbf-465d-bba8-08f81c89da64\nSubject\nMy subject\n"+
		"Timestamp\n2019-01-31T04:37:04.321Z\nTopicArn\narn:aws:sns:us-east-2:123456789012:s4-MySNSTopic-1G1WEFCOXTC0P\nType\nNotification\n", text)
	c := SNSMessage{Type: SNSSubscriptionConfirmation, Message: "My Test Message", MessageID: "3d891288-136d-417f-bc05-901c108273ee",
		SubscribeURL: "https://sns.us-east-2.amazonaws.com/?Action=ConfirmSubscription&Token=233", Timestamp: "2019-01-31T19:25:13.719Z",
		Token: "233", TopicArn: "arn:aws:sns:us-east-2:123456789012:s4-MySNSTopic-1G1WEFCOXTC0P", Subject: &subject}
	text, err = c.StringToSign()
	require.NoError(t, err)
	require.Equal(t, "Message\nMy Test Message\nMessageId\n3d891288-136d-417f-bc05-901c108273ee\n"+
		"SubscribeURL\nhttps://sns.us-east-2.amazonaws.com/?Action=ConfirmSubscription&Token=233\nTimestamp\n2019-01-31T19:25:13.719Z\n"+
		"Token\n233\nTopicArn\narn:aws:sns:us-east-2:123456789012:s4-MySNSTopic-1G1WEFCOXTC0P\nType\nSubscriptionConfirmation\n", text,
		"confirmations sign SubscribeURL and Token, never Subject")
}
