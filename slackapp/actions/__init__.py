"""Every state change of the Slack context, one module per aggregate (the OAuth install, the
installation and its settings, account links, seen signatures, channel messages);
`slackapp.services` is their public face."""
